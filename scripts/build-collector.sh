#!/bin/bash
# Build the upstream OpenTelemetry Collector with the components collector-config/ uses, using
# the collector builder (ocb) at the same release as every module, and cache the binary under
# ~/.cache/otel-eacgm keyed by the manifest's hash. Prints nothing when cached.
# Usage: build-collector.sh [--path]   (--path: print the cached binary's path only)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
manifest="$repo/collector-config/build/builder.yaml"
builder_version=v0.161.0
cache=${OTEL_EACGM_CACHE:-$HOME/.cache/otel-eacgm}
key=$(sha256sum "$manifest" | cut -c1-12)
bin="$cache/otelcol-eacgm-$key"
if [[ ${1:-} == --path ]]; then echo "$bin"; exit 0; fi
[[ -x $bin ]] && exit 0

command -v go >/dev/null || { echo "setup: Go is needed to build the collector (apt-get install golang or https://go.dev/dl)" >&2; exit 1; }
# The builder goes into a folder of its own per release, so builds of other releases (other
# checkouts sharing ~/go/bin) never swap it under this one.
gobin="$cache/builder-$builder_version"
if [[ ! -x $gobin/builder ]]; then
  echo "setup: installing the collector builder $builder_version" >&2
  GOBIN="$gobin" go install "go.opentelemetry.io/collector/cmd/builder@$builder_version"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$manifest" "$work/builder.yaml"
echo "setup: building the OpenTelemetry Collector (first time only, a few minutes)" >&2
(cd "$work" && "$gobin/builder" --config builder.yaml >build.log 2>&1) || { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$cache"
mv "$work/_build/otelcol-eacgm" "$bin"
echo "setup: collector cached at $bin" >&2
