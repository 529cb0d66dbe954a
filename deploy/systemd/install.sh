#!/bin/bash
# Install otel-eacgm as systemd services: the project in /opt/otel-eacgm (its own .venv), the
# units, and /etc/otel-eacgm/agent.yaml from examples/agent.yaml unless one exists.
# Usage: sudo deploy/systemd/install.sh [--detector]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
[[ $EUID -eq 0 ]] || { echo "install: run as root (sudo $0)" >&2; exit 1; }
if [[ $repo != /opt/otel-eacgm ]]; then
  mkdir -p /opt/otel-eacgm
  cp -a "$repo/." /opt/otel-eacgm/
fi
bash /opt/otel-eacgm/scripts/setup.sh
mkdir -p /etc/otel-eacgm
[[ -e /etc/otel-eacgm/agent.yaml ]] || cp /opt/otel-eacgm/examples/agent.yaml /etc/otel-eacgm/agent.yaml
install -m 0644 /opt/otel-eacgm/deploy/systemd/otel-eacgm-agent.service /etc/systemd/system/
units=(otel-eacgm-agent.service)
if [[ ${1:-} == --detector ]]; then
  install -m 0644 /opt/otel-eacgm/deploy/systemd/otel-eacgm-detector.service /etc/systemd/system/
  units+=(otel-eacgm-detector.service)
fi
systemctl daemon-reload
systemctl enable --now "${units[@]}"
echo "installed: ${units[*]}; edit /etc/otel-eacgm/agent.yaml (endpoint:) and systemctl restart otel-eacgm-agent"
