#!/bin/bash
# BCC attaches tracepoints and reads uprobe events through tracefs; fresh machines may not
# have it mounted. Mount it (and debugfs, where older tools look) only when missing.
set -euo pipefail
if ! mountpoint -q /sys/kernel/tracing; then
  mount -t tracefs tracefs /sys/kernel/tracing && echo "setup: mounted tracefs at /sys/kernel/tracing"
fi
if ! mountpoint -q /sys/kernel/debug; then
  mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null && echo "setup: mounted debugfs at /sys/kernel/debug" || true
fi
