"""Which watched libraries processes actually map, read from /proc/PID/maps.

PyTorch wheels ship their own libcudart and libnccl inside each virtualenv, so paths are never
assumed: every distinct file (by device and inode, seen through the process' own root so that
containers work) is found where it is mapped and attached once.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from otel_eacgm.probes.catalog import Family

# Basenames per family; the BPF open watch (calls.bpf.c, watched_library) uses the same prefixes.
FAMILY_PATTERNS: dict[Family, re.Pattern[str]] = {
    Family.CUDART: re.compile(r"^libcudart\.so(\.\d+)*$"),
    Family.CUDA: re.compile(r"^libcuda\.so(\.\d+)*$"),
    Family.NCCL: re.compile(r"^libnccl\.so(\.\d+)*$"),
    Family.TORCH: re.compile(r"^libtorch_cpu\.so(\.\d+)*$"),
    Family.PYTHON: re.compile(r"^(python3(\.\d+)?|libpython3\.\d+\w*\.so(\.[\d.]+)*)$"),
}


@dataclasses.dataclass(frozen=True)
class MappedLibrary:
    """A watched library file as one process maps it."""

    family: Family
    path: str          # path usable from the agent (through /proc/PID/root when needed)
    file_key: tuple[int, int]  # (st_dev, st_ino): one attach per distinct file


def family_of(path: str) -> Family | None:
    """The library family a path belongs to, by basename."""
    base = os.path.basename(path)
    for family, pattern in FAMILY_PATTERNS.items():
        if pattern.match(base):
            return family
    return None


def _mapped_paths(pid: int, proc: Path) -> set[str]:
    paths = set()
    try:
        with open(proc / str(pid) / "maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    paths.add(parts[5].rstrip("\n").removesuffix(" (deleted)"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return set()
    return paths


def resolve(pid: int, path: str, family: Family, proc: Path = Path("/proc")) -> MappedLibrary | None:
    """A MappedLibrary for `path` as seen by `pid`, or None if the file is gone."""
    candidates = [path]
    root = proc / str(pid) / "root"
    if str(proc) == "/proc":
        candidates.insert(0, f"{root}{path}")
    for candidate in candidates:
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        # Prefer the plain path when it is the same file: it reads better in logs.
        usable = path if candidate != path and _same_file(path, st) else candidate
        return MappedLibrary(family, usable, (st.st_dev, st.st_ino))
    return None


def _same_file(path: str, st: os.stat_result) -> bool:
    try:
        other = os.stat(path)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def libraries_of(pid: int, proc: Path = Path("/proc")) -> list[MappedLibrary]:
    """Watched libraries mapped by one process (empty if it is gone or unreadable)."""
    found = []
    for path in _mapped_paths(pid, proc):
        family = family_of(path)
        if family is not None:
            lib = resolve(pid, path, family, proc)
            if lib is not None:
                found.append(lib)
    return found


def all_pids(proc: Path = Path("/proc")) -> Iterator[int]:
    """Every process id under /proc."""
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            yield int(entry.name)


def cgroup_v2_identity(cgroup_dir: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> tuple[int, int] | None:
    """(id, level) of a cgroup v2 directory as BPF's bpf_get_current_ancestor_cgroup_id sees
    it: its inode number, and its depth below the cgroup2 mount's root (0: the root). None where
    the directory is not on a cgroup2 mount (cgroup v1)."""
    path = os.path.realpath(cgroup_dir)
    best = ""
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        mount, fstype = fields[4], fields[sep + 1]
        if fstype == "cgroup2" and (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
            best = mount
    if not best:
        return None
    level = len([part for part in os.path.relpath(path, best).split("/") if part not in ("", ".")])
    return os.stat(path).st_ino, level


def cgroup_pids(cgroup_dir: Path) -> set[int]:
    """Processes in a cgroup v2 directory and all its descendants."""
    pids: set[int] = set()
    for dirpath, _dirs, files in os.walk(cgroup_dir):
        if "cgroup.procs" in files:
            try:
                text = Path(dirpath, "cgroup.procs").read_text()
            except OSError:
                continue
            pids.update(int(p) for p in text.split())
    return pids


def scan(pids: Iterable[int], proc: Path = Path("/proc")) -> dict[int, list[MappedLibrary]]:
    """Watched libraries per pid, for the pids that map any."""
    out = {}
    for pid in pids:
        libs = libraries_of(pid, proc)
        if libs:
            out[pid] = libs
    return out
