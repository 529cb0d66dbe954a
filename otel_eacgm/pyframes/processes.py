"""Which traced processes have their Python frames walked, and with which interpreter layout.

Discovery finds an interpreter file (an executable or libpython) mapped by a traced process;
here its layout is read once per file, placed at the process' load address and written into
the BPF `py_layouts` map, and the process' code objects become readable by name. An
interpreter the agent cannot read is logged once (the doctor checks the interpreters on its
own); the process' other layers are traced as before.
"""

from __future__ import annotations

import logging
from typing import Protocol

from otel_eacgm.events import PyLayout
from otel_eacgm.probes.libraries import MappedLibrary
from otel_eacgm.pyframes.code_objects import CodeReader
from otel_eacgm.pyframes.frame_spans import FrameSpans
from otel_eacgm.pyframes.layouts import Interpreter, UnknownInterpreter, interpreter, load_bias

log = logging.getLogger(__name__)


class LayoutTable(Protocol):
    """The BPF side (bpf_program.CallProgram)."""

    def set_python_layout(self, pid: int, layout: PyLayout) -> None: ...
    def forget_python_layout(self, pid: int) -> None: ...


class FrameWalkers:
    """Registers traced Python processes with the kernel's frame walk."""

    def __init__(self, program: LayoutTable, reader: CodeReader, max_frames: int) -> None:
        self._program = program
        self._reader = reader
        self._max_frames = max_frames
        self._files: dict[tuple[int, int], Interpreter | None] = {}
        self._pids: dict[int, Interpreter] = {}
        self.spans: FrameSpans | None = None  # set once the record line exists

    def knows(self, lib: MappedLibrary) -> bool:
        """Whether `lib` is an interpreter whose frames are walked (then no USDT is needed)."""
        return self._interpreter(lib) is not None

    def register(self, lib: MappedLibrary, pid: int) -> bool:
        """Walk `pid`'s frames if `lib` is an interpreter the agent can read; True if it does."""
        if pid in self._pids:
            return True
        interp = self._interpreter(lib)
        if interp is None or pid < 0:
            return False
        bias = load_bias(pid, lib.path)
        if bias is None:  # opened, not mapped yet: a rescan comes
            return False
        if not self._reader.track(pid, interp.code, interp.code_type + bias):
            return False
        self._program.set_python_layout(pid, interp.for_process(bias, self._max_frames))
        self._pids[pid] = interp
        if self.spans is not None:
            self.spans.track(pid, interp.minor)
        log.info("pid %d: Python %s frames are read (%s, layout from %s)", pid, interp.version, lib.path,
                 interp.source)
        return True

    def forget(self, pid: int) -> None:
        """`pid` exited or executed another program."""
        if self._pids.pop(pid, None) is None:
            return
        self._program.forget_python_layout(pid)
        if self.spans is not None:
            self.spans.forget(pid)
        self._reader.forget(pid)

    def _interpreter(self, lib: MappedLibrary) -> Interpreter | None:
        if lib.file_key in self._files:
            return self._files[lib.file_key]
        try:
            found = interpreter(lib.path)
        except UnknownInterpreter as exc:
            found = None
            log.warning("Python frames are not read in processes of %s: %s; their other layers are traced",
                        lib.path, exc)
        self._files[lib.file_key] = found
        return found
