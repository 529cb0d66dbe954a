"""Ring-buffer records for the span equivalence test: every kind of span the agent makes.

Raw record bytes, exactly as the BPF side writes them (events.py structs), covering each
decoder family (runtime, driver, NCCL, a string argument, a dereferenced launch config),
Python calls with CUDA children, nesting, a failed call, a thread that died in a call
(incomplete), a C++ exception (unwound), lone outermost calls sharing a slice trace, a
parent too big for one trace (split, ``eacgm.parent.span_id``), an unsampled trace with a
failed call in it, two processes with their own resources. Also the fixed settings both
paths run with (salt, clock offset, resources, kernel names, shaper bounds).
"""

from __future__ import annotations

import ctypes
import struct

from otel_eacgm.events import (PY_PROBE_ID, CallEvent, CallFlags, CallStrEvent, EventType, PyCallEvent)
from otel_eacgm.probes.catalog import Layer, enabled_rows

SALT = 7
CLOCK_OFFSET_NS = 1_765_000_000_000_000_000
SHAPER = {"max_spans": 4, "max_delay_s": 1e9, "slice_s": 1.0, "slow_s": 0.1}
KERNEL_STUBS = {0x400: "_Z6kernelPfi"}


def resource_attributes(pid: int) -> dict[str, object]:
    """The resource of process `pid` in this test."""
    return {"service.name": f"svc-{pid}", "process.pid": pid, "host.name": "node-1"}


def rows() -> dict[int, object]:
    """slot -> catalog row, every layer, driver launches (both launch layers' rows are used)."""
    out = dict(enabled_rows(layers=frozenset(Layer), launch_layer=Layer.CUDA_DRIVER))
    out.update(enabled_rows(layers=frozenset(Layer), launch_layer=Layer.CUDA_RUNTIME))
    return out


def _slot(symbol: str) -> int:
    return next(slot for slot, spec in rows().items() if spec.symbol == symbol)  # type: ignore[attr-defined]


_DONE = CallFlags.RETURNED | CallFlags.SAMPLED


def _call(symbol: str | None, call_id: int, *, pid: int = 100, tid: int = 101, parent: int = 0, root: int = 0,
          entry_us: int = 0, dur_us: int = 5, ret: int = 0, flags: int = _DONE, out: int = 0,
          args: tuple[int, ...] = (), deref: bytes = b"") -> CallEvent:
    ev = CallEvent(type=EventType.CALL, flags=flags, probe_id=PY_PROBE_ID if symbol is None else _slot(symbol),
                   pid=pid, tid=tid, call_id=call_id, parent_id=parent, root_id=root or call_id,
                   entry_ns=10_000_000_000 + entry_us * 1000, exit_ns=10_000_000_000 + (entry_us + dur_us) * 1000,
                   ret=ret, out_value=out)
    for i, a in enumerate(args):
        ev.args[i] = a
    ev.deref[:len(deref)] = deref
    return ev


def _bytes(ev: ctypes.Structure) -> bytes:
    return bytes(memoryview(ev).cast("B"))


def _with_string(ev: CallEvent, text: bytes) -> bytes:
    ev.type = EventType.CALL_STR
    return _bytes(CallStrEvent(call=ev, str=text))


def _python(call_id: int, func: bytes, file: bytes, line: int, **kw: object) -> bytes:
    ev = _call(None, call_id, args=(0, 0, line), **kw)  # type: ignore[arg-type]
    ev.type = EventType.PY_CALL
    return _bytes(PyCallEvent(call=ev, func=func, file=file))


def records() -> list[bytes]:
    """The records, in ring-buffer order (children complete before their parents)."""
    OUT = CallFlags.OUT  # noqa: N806
    launch_cfg = struct.pack("<6IQQ", 64, 2, 1, 256, 1, 1, 1024, 0x55)
    drv_cfg = struct.pack("<7IIQ", 8, 8, 1, 128, 1, 1, 0, 0, 0x66)
    recs = [
        # a Python function (pid 100) calling CUDA: malloc (out pointer), a launch, a failed free
        _bytes(_call("cudaMalloc", 11, parent=10, root=10, entry_us=1, ret=0, flags=_DONE | OUT, out=0xBEEF00,
                     args=(0x7FFF0, 1 << 20))),
        _bytes(_call("cudaLaunchKernel", 12, parent=10, root=10, entry_us=10, ret=0,
                     args=(0x400, 2 | 3 << 32, 4, 32 | 1 << 32, 1, 0, 48, 0x55))),
        _bytes(_call("cudaLaunchKernelExC", 13, parent=10, root=10, entry_us=20, ret=98, flags=_DONE | CallFlags.DEREF,
                     args=(0x1000, 0x400), deref=launch_cfg)),
        _bytes(_call("cudaFree", 14, parent=10, root=10, entry_us=30, ret=0, args=(0xBEEF00,))),
        _bytes(_call("cudaFree", 15, parent=10, root=10, entry_us=40, ret=35, args=(0x123456,))),
        _python(10, b"train_step", b"/srv/train.py", 42, root=10, entry_us=0, dur_us=200),
        # lone outermost calls of one thread: one slice trace
        _bytes(_call("cudaDeviceSynchronize", 20, tid=102, entry_us=300, ret=0)),
        _bytes(_call("cudaStreamSynchronize", 21, tid=102, entry_us=310, ret=700, args=(0x77,))),
        _bytes(_call("cudaMemcpyAsync", 22, tid=102, entry_us=320, args=(1, 2, 4096, 1, 0x55))),
        _bytes(_call("cudaSetDevice", 23, tid=102, entry_us=330, args=(0xFFFFFFFF,), ret=101)),
        # driver: a name record (string argument), launches by handle and by config
        _with_string(_call("cuModuleGetFunction", 30, tid=103, entry_us=400, flags=_DONE | OUT, out=0xF00,
                           args=(0, 0x900, 0)), b"_Z3addPfS_i\0"),
        _bytes(_call("cuLaunchKernel", 31, tid=103, entry_us=410, args=(0xF00, 1, 1, 1, 32, 1, 1, 0, 0x66))),
        _bytes(_call("cuLaunchKernelEx", 32, tid=103, entry_us=420, ret=1, flags=_DONE | CallFlags.DEREF,
                     args=(0x2000, 0xF00), deref=drv_cfg)),
        # NCCL (pid 200): a communicator, a collective, p2p under a group
        _bytes(_call("ncclCommInitRank", 40, pid=200, tid=201, entry_us=500, flags=_DONE | OUT, out=0xC0,
                     args=(0x10, 8, 3))),
        _bytes(_call("ncclAllReduce", 42, pid=200, tid=201, parent=41, root=41, entry_us=510,
                     args=(1, 2, 1000, 7, 0, 0xC0, 0x66))),
        _bytes(_call("ncclSend", 43, pid=200, tid=201, parent=41, root=41, entry_us=520, ret=3,
                     args=(1, 64, 4, 5, 0xC0, 0x66))),
        _bytes(_call("ncclBroadcast", 44, pid=200, tid=201, parent=41, root=41, entry_us=530,
                     args=(1, 2, 16, 9, 1, 0xC0, 0x66))),
        # four children: with the parent that is one span too many for max_spans 4: split
        _bytes(_call("ncclReduce", 45, pid=200, tid=201, parent=41, root=41, entry_us=540,
                     args=(1, 2, 256, 9, 2, 1, 0xC0, 0x77))),
        _bytes(_call("ncclGroupEnd", 41, pid=200, tid=201, entry_us=505, dur_us=100)),
        # a thread that died inside a call, and a call left by a C++ exception
        _bytes(_call("cudaStreamSynchronize", 50, pid=200, tid=202, entry_us=600, flags=CallFlags.INCOMPLETE
                     | CallFlags.SAMPLED, args=(0x99,))),
        _bytes(_call("cudaMemset", 51, pid=200, tid=203, entry_us=610, flags=CallFlags.UNWOUND | CallFlags.SAMPLED,
                     args=(0x1000, 0, 512))),
        _python(52, b"", b"", 0, pid=200, tid=204, entry_us=620, flags=CallFlags.INCOMPLETE),
        # an unsampled trace: only the failed call and its ancestors leave; a slow one too
        _bytes(_call("cudaMemcpy", 61, tid=105, parent=60, root=60, entry_us=700, flags=CallFlags.RETURNED,
                     args=(1, 2, 64, 2))),
        _bytes(_call("cudaFree", 62, tid=105, parent=60, root=60, entry_us=710, ret=1, flags=CallFlags.RETURNED,
                     args=(0x5,))),
        _bytes(_call("cudaEventSynchronize", 63, tid=105, parent=60, root=60, entry_us=720, dur_us=150_000,
                     flags=CallFlags.RETURNED, args=(0xE1,))),
        _python(60, b"step", b"/srv/loop.py", 7, tid=105, entry_us=690, dur_us=200_000, flags=CallFlags.RETURNED),
    ]
    return recs
