#!/bin/bash
# One venv per test interpreter with the PyTorch wheel, cached under ~/.cache/otel-eacgm so that
# every worktree and clean clone on this machine reuses them: pyenv's CPython 3.10, 3.12 and 3.13
# (built without USDT probes). Debian's 3.11 needs none of its own: the project's .venv is that
# interpreter's venv and has torch from the test extra. tests/ebpf/test_python_frames.py traces
# a training loop on each (Python > aten:: with no profile function set).
#
# The PyPI wheel is the CUDA build: its CPU part runs without a GPU, but libtorch links the CUDA
# libraries (RPATH $ORIGIN/../../nvidia/...), 2.7 GB of python-independent nvidia-* wheels. They
# are installed once into a shared folder, linked as site-packages/nvidia into each venv; torch
# itself goes in with its pure-Python requirements and numpy, pinned as pip resolves them for that
# interpreter (triton and cuda-bindings serve torch.compile and torch.cuda only, and are left out).
# A venv is ready when its stamp exists.
# Usage: torch-pyvenvs.sh [--path MINOR]   (--path 3.12: print that venv's python only)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# the test extra's pin in pyproject.toml (2.13.0 has wheels for cp310-cp314): a new pin, new venvs
torch_version=$(sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' "$repo/pyproject.toml")
[[ -n $torch_version ]] || { echo "setup: no \"torch==VERSION\" pin in $repo/pyproject.toml" >&2; exit 1; }
minors=(3.10 3.12 3.13)
cache=${OTEL_EACGM_CACHE:-$HOME/.cache/otel-eacgm}/pyvenvs/torch-$torch_version
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
if [[ ${1:-} == --path ]]; then echo "$cache/${2:?usage: --path MINOR}/bin/python"; exit 0; fi
log() { echo "setup: $*" >&2; }

interpreter() {  # the newest pyenv build of CPython $1, or nothing
  { ls -d "$pyenv_root/versions/$1".[0-9]* 2>/dev/null || true; } | sort -V | tail -1 | sed "s|\$|/bin/python$1|"
}

nvidia_libs="$cache/nvidia-libs"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # worktrees and clones running set-up at once make each venv once
for minor in "${minors[@]}"; do
  venv="$cache/$minor"
  [[ -f $venv/.ready ]] && continue
  python=$(interpreter "$minor")
  if [[ -z $python || ! -x $python ]]; then
    log "no pyenv CPython $minor under $pyenv_root/versions: its torch venv is not made (its tests skip)"
    continue
  fi
  started=$SECONDS
  log "making the torch $torch_version venv of $python at $venv (first time only, 1-2 minutes)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # resolve torch and numpy (torch warns on import without it) for this interpreter, then install
  # the pins with --no-deps: the CUDA libraries into the shared folder, the rest into the venv
  "$venv/bin/python" -m pip install -q --dry-run --ignore-installed --report "$venv/resolved.json" \
    "torch==$torch_version" numpy
  pure=() cuda=()
  while read -r name version; do
    case $name in
      nvidia-* | cuda-toolkit) cuda+=("$name==$version") ;;
      cuda-bindings | cuda-pathfinder | triton) ;;
      *) pure+=("$name==$version") ;;
    esac
  done < <("$venv/bin/python" -c 'import json, sys
for p in json.load(open(sys.argv[1]))["install"]:
    print(p["metadata"]["name"].lower(), p["metadata"]["version"])' "$venv/resolved.json")
  "$venv/bin/python" -m pip install -q --no-deps "${pure[@]}"
  if [[ ! -f $nvidia_libs/.ready ]]; then
    log "installing torch's CUDA libraries once into $nvidia_libs: ${cuda[*]}"
    rm -rf "$nvidia_libs"
    "$venv/bin/python" -m pip install -q --no-deps --target "$nvidia_libs" "${cuda[@]}"
    touch "$nvidia_libs/.ready"
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  ln -sfn "$nvidia_libs/nvidia" "$site/nvidia"
  (cd / && "$venv/bin/python" -c 'import torch; torch.nn.Linear(2, 2)(torch.ones(1, 2)).sum().backward()') \
    || { log "torch does not run in $venv"; exit 1; }
  touch "$venv/.ready"
  log "torch venv of CPython $minor ready in $((SECONDS - started)) s"
done
