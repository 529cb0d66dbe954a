#!/bin/bash
# Fetch Zipkin's server (io.zipkin:zipkin-server:3.5.1, classifier exec: a runnable jar with the
# Zipkin Lens UI inside) from Maven Central once and cache it under ~/.cache/otel-eacgm. `make demo`
# and the browser tests run it with Java 17 (Debian's default-jre-headless); the collector's zipkin
# exporter feeds it. Prints nothing when cached.
# Usage: fetch-zipkin.sh [--path]   (--path: print the cached jar's path only)
set -euo pipefail
version=3.5.1
cache=${OTEL_EACGM_CACHE:-$HOME/.cache/otel-eacgm}
jar="$cache/zipkin-server-$version-exec.jar"
if [[ ${1:-} == --path ]]; then echo "$jar"; exit 0; fi
[[ -s $jar ]] && exit 0

command -v mvn >/dev/null || { echo "setup: Maven is needed to fetch Zipkin (apt-get install maven)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "setup: fetching Zipkin $version from Maven Central (first time only)" >&2
mvn -q -B dependency:copy -Dartifact="io.zipkin:zipkin-server:$version:jar:exec" \
  -DoutputDirectory="$work" >"$work/fetch.log" 2>&1 || { tail -30 "$work/fetch.log" >&2; exit 1; }
mkdir -p "$cache"
mv "$work/zipkin-server-$version-exec.jar" "$jar"
echo "setup: Zipkin cached at $jar" >&2
