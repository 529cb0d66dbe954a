#!/bin/bash
# Build Jaeger (v2 binary, OTLP in, query API and UI) from the Go module proxy and cache it under
# ~/.cache/otel-eacgm. `go install github.com/jaegertracing/jaeger/cmd/jaeger@v1.76.0` is refused
# (Jaeger's go.mod has replace directives), and v1.75.0 is the release this proxy approves, so the
# binary is built inside a scratch module that requires it. Prints nothing when cached.
# Usage: build-jaeger.sh [--path]   (--path: print the cached binary's path only)
set -euo pipefail
version=v1.75.0
cache=${OTEL_EACGM_CACHE:-$HOME/.cache/otel-eacgm}
bin="$cache/jaeger-$version"
if [[ ${1:-} == --path ]]; then echo "$bin"; exit 0; fi
[[ -x $bin ]] && exit 0

command -v go >/dev/null || { echo "setup: Go is needed to build Jaeger (apt-get install golang or https://go.dev/dl)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "setup: building Jaeger $version (first time only, several minutes)" >&2
(
  cd "$work"
  go mod init otel-eacgm/jaeger-build
  go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$version"
  go build -o jaeger github.com/jaegertracing/jaeger/cmd/jaeger
) >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$cache"
mv "$work/jaeger" "$bin"
echo "setup: Jaeger cached at $bin" >&2
