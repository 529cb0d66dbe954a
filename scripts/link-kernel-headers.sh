#!/bin/bash
# BCC compiles its programs against /lib/modules/$(uname -r)/build. When no headers package
# matches the running kernel (the case on these VMs: kernel 6.18, Debian ships 6.1 headers),
# link the newest installed Debian headers there; they work for uprobe and tracepoint programs.
# Does nothing when matching headers exist.
set -euo pipefail
k=$(uname -r)
dir=/lib/modules/$k
if [[ -e $dir/build/include/linux/kconfig.h || -e $dir/build/include/generated/autoconf.h ]]; then
  exit 0
fi
hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1 || true)
if [[ -z $hdr ]]; then
  echo "setup: no kernel headers for $k and none under /usr/src (apt-get install linux-headers-amd64)" >&2
  exit 1
fi
common=${hdr%-amd64}-common
mkdir -p "$dir"
ln -sfn "$hdr" "$dir/build"
ln -sfn "$common" "$dir/source"
echo "setup: no kernel headers match $k; linked $dir/build -> $hdr and source -> $common (fine for uprobes/tracepoints)"
