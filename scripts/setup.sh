#!/bin/bash
# One-shot, idempotent set-up on Debian 12 for `make test` and `make demo`:
# system packages (BCC, kernel headers, compiler), kernel headers usable by BCC, the project's
# virtualenv at .venv (Debian's python3.11 with --system-site-packages, so it sees the Debian
# bcc module and has Python USDT probes), venvs with PyTorch for pyenv's CPython 3.10, 3.12 and
# 3.13 (torch-pyvenvs.sh), cached OpenTelemetry Collector, Jaeger and VictoriaLogs builds,
# Zipkin's server jar from Maven Central (Java 17 runs it), and headless Chromium (the
# end-to-end tests open traces in Zipkin Lens and anomaly records in VictoriaLogs' UI).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
log() { echo "setup: $*"; }

apt_packages=(python3-bpfcc python3-venv python3-dev linux-headers-amd64 gcc make chromium chromium-driver
  openjdk-17-jre-headless maven)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: need root to install ${missing[*]} (run: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

bash "$repo/scripts/link-kernel-headers.sh"
[[ $(id -u) -eq 0 ]] && bash "$repo/scripts/mount-tracefs.sh"

venv="$repo/.venv"
stamp="$venv/.otel-eacgm-installed"
if [[ ! -x $venv/bin/python ]]; then
  log "creating $venv on /usr/bin/python3.11 (--system-site-packages)"
  /usr/bin/python3.11 -m venv --system-site-packages "$venv"
fi
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  log "installing otel-eacgm and its test dependencies into .venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e ".[test]"
  # VUS-PR for benchmarks/detector_accuracy.py; --no-deps: the metric needs only numpy and
  # scikit-learn, its declared dependencies (torch, transformers, ...) are for its models.
  "$venv/bin/python" -m pip install -q --no-deps "tsb-ad==1.5"
  touch "$stamp"
fi
"$venv/bin/python" -c "import bcc" || { echo "setup: the venv cannot import bcc (python3-bpfcc)" >&2; exit 1; }

bash "$repo/scripts/torch-pyvenvs.sh"
bash "$repo/scripts/build-collector.sh" >/dev/null
bash "$repo/scripts/build-jaeger.sh" >/dev/null
bash "$repo/scripts/build-victorialogs.sh" >/dev/null
bash "$repo/scripts/fetch-zipkin.sh" >/dev/null
log "ready: .venv/bin/otel-eacgm, collector $(bash "$repo/scripts/build-collector.sh" --path)," \
  "Jaeger $(bash "$repo/scripts/build-jaeger.sh" --path)," \
  "VictoriaLogs $(bash "$repo/scripts/build-victorialogs.sh" --path), Zipkin $(bash "$repo/scripts/fetch-zipkin.sh" --path)"
