"""The agent's only contact with BCC: compile bpf/calls.bpf.c, attach probes, read maps.

Knobs reach the BPF program as -D flags, never by editing its text. Everything that can fail
in the kernel or in BCC is turned into a typed exception here, so the rest of the agent never
sees BCC's generic ``Exception``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path

from otel_eacgm.events import MAX_ARGS, CallEvent, Stat
from otel_eacgm.probes.catalog import MAX_SLOTS, ProbeSpec

log = logging.getLogger(__name__)

BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"


class BpfError(RuntimeError):
    """The BPF program could not be compiled, loaded or attached."""


class SymbolMissing(BpfError):
    """A catalog symbol is not in this library version (skipped, never fatal)."""


@dataclasses.dataclass(frozen=True)
class ProgramOptions:
    """Compile-time knobs of calls.bpf.c (see its header comment)."""

    filter_pids: bool
    follow_forks: bool = True
    gate_opens: bool = False
    ringbuf_pages: int = 1024
    agent_pid: int = dataclasses.field(default_factory=os.getpid)

    def cflags(self) -> list[str]:
        """The -D/-I flags for BCC."""
        if self.ringbuf_pages <= 0 or self.ringbuf_pages & (self.ringbuf_pages - 1):
            raise ValueError(f"ringbuf_pages {self.ringbuf_pages} must be a power of two")
        flags = [
            f"-I{BPF_DIR}",
            f"-DEACGM_PROBE_SLOTS={MAX_SLOTS}",
            f"-DEACGM_RINGBUF_PAGES={self.ringbuf_pages}",
            f"-DEACGM_AGENT_PID={self.agent_pid}",
        ]
        if self.filter_pids:
            flags.append("-DEACGM_FILTER_PIDS")
            if self.follow_forks:
                flags.append("-DEACGM_FOLLOW_FORKS")
            if self.gate_opens:
                flags.append("-DEACGM_GATE_OPENS")
        return flags


def import_bcc():  # noqa: ANN202 - bcc has no type information
    try:
        import bcc  # type: ignore[import-not-found]
    except ImportError as exc:
        raise BpfError(
            f"cannot import bcc ({exc}): install Debian's python3-bpfcc and run the agent with a "
            "Python that sees it (.venv is built with --system-site-packages for this)"
        ) from exc
    return bcc


class CallProgram:
    """calls.bpf.c loaded into the kernel."""

    def __init__(self, options: ProgramOptions, *, dump: Callable[[str], None] | None = None) -> None:
        bcc = import_bcc()
        self._bcc = bcc
        self.options = options
        src = BPF_DIR / "calls.bpf.c"
        if dump is not None:
            dump(f"// cflags: {' '.join(options.cflags())}\n{src.read_text()}")
        try:
            self._bpf = bcc.BPF(src_file=str(src).encode(), cflags=options.cflags())
        except Exception as exc:  # BCC raises bare Exception for compile and load errors
            raise BpfError(
                f"loading {src} failed: {exc}. Run `otel-eacgm doctor` (kernel headers, root, BPF)."
            ) from exc
        self._attached: list[tuple[str, str, bool]] = []

    def configure(self, slot: int, spec: ProbeSpec) -> None:
        """Write a catalog row's settings into probe_conf[slot]."""
        table = self._bpf["probe_conf"]
        table[ctypes.c_int(slot)] = table.Leaf(has_return=int(spec.has_return), deref_arg=spec.deref_arg,
                                                    out_arg=spec.out_arg, str_arg=spec.str_arg)

    def attach(self, path: str, spec: ProbeSpec, slot: int) -> None:
        """Attach entry_<slot> (and return_<slot>) to `spec.symbol` in the library at `path`.

        Raises SymbolMissing when the library has no such symbol, BpfError otherwise.
        """
        name = path.encode()
        sym = spec.symbol.encode()
        try:
            self._bpf.attach_uprobe(name=name, sym=sym, fn_name=f"entry_{slot}".encode())
            if spec.has_return:
                self._bpf.attach_uretprobe(name=name, sym=sym, fn_name=f"return_{slot}".encode())
        except Exception as exc:
            text = str(exc)
            if "could not determine address of symbol" in text:
                raise SymbolMissing(f"{spec.symbol} not in {path}") from None
            raise BpfError(f"attaching {spec.symbol} in {path} failed: {text}") from exc
        self._attached.append((path, spec.symbol, spec.has_return))

    @property
    def probe_count(self) -> int:
        """Uprobes plus uretprobes attached so far."""
        return sum(2 if ret else 1 for _, _, ret in self._attached)

    def add_target(self, pid: int) -> None:
        """Trace this tgid (only meaningful when compiled with filter_pids)."""
        table = self._bpf["targets"]
        table[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def targets(self) -> set[int]:
        """Tgids currently traced (children added by the fork tracepoint included)."""
        return {k.value for k in self._bpf["targets"].keys()}

    def open_ring(self, callback: Callable[[int, int], None]) -> None:
        """Deliver ring-buffer records as (pointer, size) to `callback`."""

        def _cb(_ctx: object, data: int, size: int) -> int:
            callback(data, size)
            return 0

        self._bpf["events"].open_ring_buffer(_cb)

    def poll(self, timeout_ms: int) -> None:
        """Wait up to timeout_ms for records and run the ring callback on each."""
        self._bpf.ring_buffer_poll(timeout_ms)

    def stats(self) -> dict[Stat, int]:
        """The kernel-side counters (drops, overflows, unmatched returns)."""
        table = self._bpf["stats"]
        return {s: int(table[ctypes.c_int(s.value)].value) for s in Stat}

    def pop_frames(self, pid: int, tid: int, depth: int) -> list[CallEvent]:
        """Frames a dead thread left open, as call records (outermost first); frees them."""
        table = self._bpf["inflight"]
        out = []
        for d in range(min(depth, 16)):
            key = table.Key(tid, d)
            try:
                f = table[key]
            except KeyError:
                continue
            ev = CallEvent(pid=pid, tid=tid, probe_id=f.probe_id, depth=d, call_id=f.call_id,
                           parent_id=f.parent_id, root_id=f.root_id, entry_ns=f.entry_ns,
                           flags=f.flags)
            for i in range(MAX_ARGS):
                ev.args[i] = f.args[i]
            ctypes.memmove(ev.deref, bytes(f.deref), len(bytes(f.deref)))
            out.append(ev)
            try:
                del table[key]
            except KeyError:
                pass
        return out

    def symbolize(self, pid: int, addr: int) -> str | None:
        """Symbol name at `addr` in a live process (mangled names are demangled by BCC)."""
        name = self._bcc.BPF.sym(addr, pid, demangle=False)
        text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        return None if text.startswith("[unknown]") else text

    def close(self) -> None:
        """Detach everything and free the maps."""
        self._bpf.cleanup()
