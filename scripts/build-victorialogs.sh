#!/bin/bash
# Build VictoriaLogs (Apache-2.0 log store: OTLP logs in, LogsQL query API and web UI out) from the
# Go module proxy and cache it under ~/.cache/otel-eacgm. `make demo` and the tests send the
# detector's anomaly records to it through the collector's otlphttp exporter. Prints nothing when
# cached.
# Usage: build-victorialogs.sh [--path]   (--path: print the cached binary's path only)
set -euo pipefail
version=v1.52.2
cache=${OTEL_EACGM_CACHE:-$HOME/.cache/otel-eacgm}
bin="$cache/victoria-logs-$version"
if [[ ${1:-} == --path ]]; then echo "$bin"; exit 0; fi
[[ -x $bin ]] && exit 0

command -v go >/dev/null || { echo "setup: Go is needed to build VictoriaLogs (apt-get install golang or https://go.dev/dl)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "setup: building VictoriaLogs $version (first time only, a few minutes)" >&2
GOBIN="$work" go install "github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs@$version" \
  >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$cache"
mv "$work/victoria-logs" "$bin"
echo "setup: VictoriaLogs cached at $bin" >&2
