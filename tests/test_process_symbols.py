"""ProcessSymbols against real processes and the real libcudart's symbol tables (no BPF needed).

The child loads the wheel's libcudart when told to and prints the address of one of its
functions; the symbolizer must name that address whenever the library was mapped while the
process lived, and only then.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_eacgm.process_symbols import ProcessSymbols

CUDART = next(Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cu13/lib/libcudart.so.13"))
CHILD = f"""
import ctypes, sys
print("ready", flush=True)
input()
lib = ctypes.CDLL({str(CUDART)!r})
print(ctypes.cast(lib.cudaGetErrorName, ctypes.c_void_p).value, flush=True)
input()
"""


class Child:
    """A Python process that maps libcudart on its first line of input and exits on its second."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        assert self.proc.stdout.readline() == "ready\n"  # started: its map holds still until told
        self.address = 0

    def load(self) -> int:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.address = int(self.proc.stdout.readline())
        return self.address

    def exit(self) -> None:
        """Exit and be reaped: /proc/PID is gone."""
        self.proc.stdin.write("\n")
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    yield c
    if c.proc.poll() is None:
        c.proc.kill()
        c.proc.wait(30)


@pytest.fixture
def symbols() -> Iterator[ProcessSymbols]:
    s = ProcessSymbols(eager=True)
    yield s
    s.close()


def test_a_library_mapped_after_the_first_read_is_found_on_a_miss(child: Child, symbols: ProcessSymbols) -> None:
    symbols.track(child.pid)
    assert symbols.resolve(child.pid, 0x10) is None
    assert symbols.resolve(child.pid, child.load()) == "cudaGetErrorName"


def _open_files(needle: str) -> list[str]:
    """This process's open files whose path contains `needle` (shown when a name is missing)."""
    out = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if needle in target:
            out.append(f"{fd.name} -> {target}")
    return out


def test_names_outlive_the_process_when_its_map_was_read_while_it_lived(child: Child, symbols: ProcessSymbols) -> None:
    address = child.load()
    assert symbols.refresh(child.pid)  # the agent's rescan after the library was opened
    held = _open_files("libcudart")
    child.exit()
    assert not Path(f"/proc/{child.pid}").exists()
    assert symbols.resolve(child.pid, address) == "cudaGetErrorName", (hex(address), held, _open_files("libcudart"))


def test_a_process_first_seen_after_it_exited_has_no_names(child: Child, symbols: ProcessSymbols) -> None:
    address = child.load()
    child.exit()
    assert symbols.resolve(child.pid, address) is None


def test_the_map_is_read_again_only_when_its_code_changed(child: Child, symbols: ProcessSymbols) -> None:
    symbols.track(child.pid)
    assert not symbols.refresh(child.pid)
    child.load()
    assert symbols.refresh(child.pid)
    assert not symbols.refresh(child.pid)
    child.exit()
    assert not symbols.refresh(child.pid)  # gone: the map read while it lived is kept
    assert symbols.resolve(child.pid, child.address) == "cudaGetErrorName"


def test_a_forgotten_process_is_read_afresh(child: Child, symbols: ProcessSymbols) -> None:
    address = child.load()
    symbols.track(child.pid)
    symbols.forget(child.pid)
    child.exit()
    assert symbols.resolve(child.pid, address) is None


def test_without_eager_nothing_is_read_before_the_first_lookup(child: Child) -> None:
    lazy = ProcessSymbols(eager=False)
    try:
        address = child.load()
        lazy.track(child.pid)
        assert not lazy.refresh(child.pid)
        assert _open_files("libcudart") == []  # no cache, no open libraries
        child.exit()
        assert lazy.resolve(child.pid, address) is None
    finally:
        lazy.close()
