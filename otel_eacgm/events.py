"""ctypes mirror of bpf/events.h: the records the BPF programs put on the ring buffer.

Kept in one module so that the layout lives in exactly two places (the header and here);
tests/test_events.py compiles the header and checks every size and offset against these.
"""

from __future__ import annotations

import ctypes
import enum
import functools
from typing import NamedTuple

import numpy as np

MAX_ARGS = 10
DEREF_BYTES = 40
STR_BYTES = 256
PATH_BYTES = 256
MAX_DEPTH = 32
FUNC_BYTES = 96
PY_RULES = 16
PY_NAMES = 64
PY_PROBE_ID = 65535
DUR_BUCKETS = 32
DUR_SHIFT = 9
BW_BUCKETS = 32
BW_SHIFT = 19
STATUS_UNWOUND = -2**31
PY_FRAMES = 64
PY_NONE = 65535


class EventType(enum.IntEnum):
    """First byte of every ring-buffer record."""

    CALL = 1
    CALL_STR = 2
    LIB_OPEN = 3
    THREAD_EXIT = 4
    PY_CALL = 5
    EXEC = 6
    PY_STACK = 7
    FORK_HELD = 8  # struct exec_event: a child stopped at its birth until its probes are linked


class PyWalk(enum.IntEnum):
    """How a Python frame walk ended (`py_stack_event.status`, enum eacgm_py_walk)."""

    DONE = 0
    DEEP = 1
    FAULT = 2
    NO_THREAD = 3


class CallFlags(enum.IntFlag):
    """`call_event.flags` bits."""

    RETURNED = 1
    INCOMPLETE = 2
    DEREF = 4
    OUT = 8
    UNWOUND = 16
    SAMPLED = 32
    KEEP = 64


class Stat(enum.IntEnum):
    """Indexes of the BPF `stats` array (enum eacgm_stat in calls.bpf.c)."""

    RINGBUF_DROPS = 0
    DEPTH_OVERFLOW = 1
    UNMATCHED_RETURN = 2
    MISMATCHED_RETURN = 3
    INFLIGHT_FULL = 4
    SAMPLED_OUT = 5
    STATS_FULL = 6
    CYCLED_RETURN = 7


class CallEvent(ctypes.Structure):
    """One completed (or entry-only) call: struct call_event."""

    _fields_ = [
        ("type", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("probe_id", ctypes.c_uint16),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("depth", ctypes.c_uint32),
        ("pad0", ctypes.c_uint32),
        ("call_id", ctypes.c_uint64),
        ("parent_id", ctypes.c_uint64),
        ("root_id", ctypes.c_uint64),
        ("entry_ns", ctypes.c_uint64),
        ("exit_ns", ctypes.c_uint64),
        ("ret", ctypes.c_int64),
        ("out_value", ctypes.c_uint64),
        ("args", ctypes.c_uint64 * MAX_ARGS),
        ("deref", ctypes.c_uint8 * DEREF_BYTES),
    ]


class CallStrEvent(ctypes.Structure):
    """A call whose catalog row captures a string argument: struct call_str_event."""

    _fields_ = [("call", CallEvent), ("str", ctypes.c_char * STR_BYTES)]


class PyCallEvent(ctypes.Structure):
    """A Python function call: struct py_call_event (args[0]/[1] string addresses, args[2] line)."""

    _fields_ = [("call", CallEvent), ("func", ctypes.c_char * FUNC_BYTES), ("file", ctypes.c_char * PATH_BYTES)]


class LibOpenEvent(ctypes.Structure):
    """A traced process opened a watched library: struct lib_open_event."""

    _fields_ = [
        ("type", ctypes.c_uint8),
        ("gated", ctypes.c_uint8),
        ("pad0", ctypes.c_uint16),
        ("pid", ctypes.c_uint32),
        ("path", ctypes.c_char * PATH_BYTES),
    ]


class ThreadExitEvent(ctypes.Structure):
    """A thread exited with traced calls still open: struct thread_exit_event."""

    _fields_ = [
        ("type", ctypes.c_uint8),
        ("pad0", ctypes.c_uint8 * 3),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("depth", ctypes.c_uint32),
        ("exit_ns", ctypes.c_uint64),
    ]


class ExecEvent(ctypes.Structure):
    """A process executed a new program: struct exec_event."""

    _fields_ = [
        ("type", ctypes.c_uint8),
        ("pad0", ctypes.c_uint8 * 3),
        ("pid", ctypes.c_uint32),
    ]


class ProbeConf(ctypes.Structure):
    """Per-probe settings in the BPF `probe_conf` array: struct probe_conf."""

    _fields_ = [
        ("has_return", ctypes.c_uint8),
        ("exit_probes", ctypes.c_uint8),
        ("returns_status", ctypes.c_uint8),
        ("always_send", ctypes.c_uint8),
        ("deref_arg", ctypes.c_int32),
        ("out_arg", ctypes.c_int32),
        ("str_arg", ctypes.c_int32),
        ("usdt_reg", ctypes.c_int32 * 3),
        ("key_arg", ctypes.c_int32),
        ("count_arg", ctypes.c_int32),
        ("dtype_arg", ctypes.c_int32),
        ("cyclable", ctypes.c_uint8),
        ("pad1", ctypes.c_uint8 * 3),
    ]


class PyFrame(ctypes.Structure):
    """One walked Python frame: struct py_frame (code 0: a frame the interpreter owns)."""

    _fields_ = [
        ("code", ctypes.c_uint64),
        ("instr", ctypes.c_uint32),
        ("firstlineno", ctypes.c_int32),
    ]


class PyStackEvent(ctypes.Structure):
    """The Python frames above an outermost traced call, innermost first: struct py_stack_event."""

    _fields_ = [
        ("type", ctypes.c_uint8),
        ("status", ctypes.c_uint8),
        ("count", ctypes.c_uint16),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("pad0", ctypes.c_uint32),
        ("call_id", ctypes.c_uint64),
        ("frames", PyFrame * PY_FRAMES),
    ]


class PyLayout(ctypes.Structure):
    """Where one process keeps its interpreter's state: struct py_layout (BPF `py_layouts`)."""

    _fields_ = [
        ("runtime", ctypes.c_uint64),
        ("interp_head", ctypes.c_uint16),
        ("threads_head", ctypes.c_uint16),
        ("ts_next", ctypes.c_uint16),
        ("ts_id", ctypes.c_uint16),
        ("ts_frame", ctypes.c_uint16),
        ("cframe_frame", ctypes.c_uint16),
        ("fr_back", ctypes.c_uint16),
        ("fr_code", ctypes.c_uint16),
        ("fr_instr", ctypes.c_uint16),
        ("fr_owner", ctypes.c_uint16),
        ("fr_size", ctypes.c_uint16),
        ("co_firstlineno", ctypes.c_uint16),
        ("co_code", ctypes.c_uint16),
        ("match_fs", ctypes.c_uint8),
        ("lasti", ctypes.c_uint8),
        ("tagged", ctypes.c_uint8),
        ("pad0", ctypes.c_uint8 * 3),
        ("max_frames", ctypes.c_uint32),
        ("task_fsbase", ctypes.c_uint32),
    ]


class PyRule(ctypes.Structure):
    """One Python filter rule in the BPF `py_rules` array: struct py_rule."""

    _fields_ = [
        ("used", ctypes.c_uint8),
        ("include", ctypes.c_uint8),
        ("prefix_len", ctypes.c_uint8),
        ("pad0", ctypes.c_uint8),
        ("func_hash", ctypes.c_uint32),
        ("need", ctypes.c_uint64),
        ("prefix", ctypes.c_char * 16),
    ]


EVENT_STRUCTS: dict[EventType, type[ctypes.Structure]] = {
    EventType.CALL: CallEvent,
    EventType.CALL_STR: CallStrEvent,
    EventType.LIB_OPEN: LibOpenEvent,
    EventType.THREAD_EXIT: ThreadExitEvent,
    EventType.PY_CALL: PyCallEvent,
    EventType.EXEC: ExecEvent,
    EventType.PY_STACK: PyStackEvent,
    EventType.FORK_HELD: ExecEvent,
}


def decode(record: bytes) -> tuple[EventType, ctypes.Structure]:
    """One ring-buffer record (copied out of the ring by the poll) as its typed struct; its type too.

    Raises ValueError for an unknown type byte or a record shorter than its struct.
    """
    kind = record[0] if record else -1
    try:
        event_type = EventType(kind)
        struct = EVENT_STRUCTS[event_type]
    except ValueError:
        raise ValueError(f"unknown event type byte {kind} (size {len(record)}); expected one of {list(EventType)}") from None
    if len(record) < ctypes.sizeof(struct):
        raise ValueError(f"{struct.__name__} record of {len(record)} bytes, expected {ctypes.sizeof(struct)}")
    return event_type, struct.from_buffer_copy(record)  # copies sizeof(struct) bytes

class Call(NamedTuple):
    """One call record as Python values (CallEvent's fields that spans and decoders read).

    Made in bulk by `decode_calls`: a NamedTuple is built in C from a row, where a ctypes
    struct costs a copy and a slow attribute read per field.
    """

    flags: int
    probe_id: int
    pid: int
    tid: int
    depth: int
    call_id: int
    parent_id: int
    root_id: int
    entry_ns: int
    exit_ns: int
    ret: int
    out_value: int
    args: list[int]
    deref: bytes


def _call_dtype() -> np.dtype:
    """CallEvent as a numpy structured dtype, from the ctypes layout (one source of offsets)."""
    names, formats, offsets = [], [], []
    for name, ctype in CallEvent._fields_:
        names.append(name)
        offsets.append(getattr(CallEvent, name).offset)
        if name == "args":
            formats.append(("<u8", (MAX_ARGS,)))
        elif name == "deref":
            formats.append(f"V{DEREF_BYTES}")
        else:
            formats.append(np.dtype(ctype).newbyteorder("<"))
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": ctypes.sizeof(CallEvent)})


CALL_DTYPE = _call_dtype()
_new_call = functools.partial(tuple.__new__, Call)  # Call(*row) without the Python-level __new__
CALL_SIZE = ctypes.sizeof(CallEvent)
_SCALARS = [f for f in Call._fields if f not in ("args", "deref")]


def decode_calls(records: list[bytes]) -> tuple[list[Call], np.ndarray]:
    """The call part (the leading CallEvent) of each record, decoded in one numpy view; the
    view too, for the columns computed in bulk (span ids).

    Records of CALL_STR and PY_CALL start with a CallEvent too; their tails are read apart.
    Raises ValueError for a record shorter than a CallEvent.
    """
    if any(len(r) != CALL_SIZE for r in records):
        if any(len(r) < CALL_SIZE for r in records):
            short = min(len(r) for r in records)
            raise ValueError(f"call record of {short} bytes, expected at least {CALL_SIZE}")
        records = [r[:CALL_SIZE] for r in records]
    rows = np.frombuffer(b"".join(records), CALL_DTYPE)
    columns = [rows[name].tolist() for name in _SCALARS]
    columns.append(rows["args"].tolist())
    columns.append(rows["deref"].tolist())
    return list(map(_new_call, zip(*columns))), rows


def call_record(ev: CallEvent) -> bytes:
    """The ring-buffer bytes of a CallEvent (frames a dead thread left, read from a map)."""
    return bytes(memoryview(ev).cast("B"))
