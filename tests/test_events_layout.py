"""bpf/events.h and otel_eacgm/events.py must agree byte for byte, and the BPF side's indexes
(stats counters, tail-called programs) must be the ones the agent uses."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_eacgm import events
from otel_eacgm.bpf_program import Tail

BPF = Path(__file__).resolve().parent.parent / "bpf"
HEADER = BPF / "events.h"
RECORDS = BPF / "calls" / "records.bpf.h"  # enum eacgm_stat, enum eacgm_tail
STRUCTS = {
    "call_event": events.CallEvent,
    "call_str_event": events.CallStrEvent,
    "lib_open_event": events.LibOpenEvent,
    "thread_exit_event": events.ThreadExitEvent,
    "exec_event": events.ExecEvent,
    "probe_conf": events.ProbeConf,
    "py_call_event": events.PyCallEvent,
    "py_rule": events.PyRule,
    "py_frame": events.PyFrame,
    "py_stack_event": events.PyStackEvent,
    "py_layout": events.PyLayout,
}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc needed to compile bpf/events.h")
    lines = []
    for cname, py in STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof(struct {cname}));')
        for field, _ in py._fields_:
            if cname in ("call_str_event", "py_call_event") and field == "call":
                continue
            lines.append(f'printf("{cname}.{field} %zu\\n", offsetof(struct {cname}, {field}));')
    src = ("#include <stdio.h>\n#include <stddef.h>\n#include <linux/types.h>\n"
           f'#include "{HEADER}"\nint main(void) {{ {" ".join(lines)} return 0; }}\n')
    d = tmp_path_factory.mktemp("layout")
    (d / "layout.c").write_text(src)
    subprocess.run(["gcc", "-o", str(d / "layout"), str(d / "layout.c")], check=True)
    out = subprocess.run([str(d / "layout")], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


@pytest.mark.parametrize("cname", STRUCTS)
def test_struct_layout_matches(c_layout: dict[str, int], cname: str) -> None:
    py = STRUCTS[cname]
    assert ctypes.sizeof(py) == c_layout[cname]
    for field, _ in py._fields_:
        key = f"{cname}.{field}"
        if key in c_layout:
            assert getattr(py, field).offset == c_layout[key], key


def test_constants_match_header() -> None:
    text = HEADER.read_text()
    for name, value in [("EACGM_MAX_ARGS", events.MAX_ARGS), ("EACGM_DEREF_BYTES", events.DEREF_BYTES),
                        ("EACGM_STR_BYTES", events.STR_BYTES), ("EACGM_PATH_BYTES", events.PATH_BYTES),
                        ("EACGM_MAX_DEPTH", events.MAX_DEPTH), ("EACGM_FUNC_BYTES", events.FUNC_BYTES),
                        ("EACGM_PY_RULES", events.PY_RULES), ("EACGM_PY_NAMES", events.PY_NAMES),
                        ("EACGM_PY_PROBE_ID", events.PY_PROBE_ID), ("EACGM_PY_FRAMES", events.PY_FRAMES),
                        ("EACGM_PY_NONE", events.PY_NONE)]:
        assert f"#define {name} {value}" in text
    for member in events.EventType:
        assert f"EACGM_EVENT_{member.name} = {member.value}" in text
    for walk in events.PyWalk:
        assert f"EACGM_PY_WALK_{walk.name} = {walk.value}" in text


def _enum(prefix: str) -> dict[str, int]:
    found = {m.group(1): int(m.group(2)) for m in re.finditer(rf"\b{prefix}_(\w+) = (\d+)", RECORDS.read_text())}
    assert found, f"no {prefix}_* enumerators in {RECORDS}: the pattern or the file is stale"
    return found


def test_stat_indexes_match_bpf() -> None:
    bpf = _enum("STAT")
    assert bpf.pop("COUNT") == len(events.Stat)
    assert bpf == {m.name: m.value for m in events.Stat}


def test_tail_indexes_match_bpf() -> None:
    bpf = _enum("TAIL")
    # the agent fills tails[] by these indexes and puts them in uprobe_multi cookies
    assert {m.name: m.value for m in Tail}.items() <= bpf.items()
    assert bpf.pop("COUNT") == max(bpf.values()) + 1


def test_decode_rejects_unknown_and_short_records() -> None:
    with pytest.raises(ValueError, match="unknown event type byte 99"):
        events.decode(bytes([99]) + bytes(7))
    with pytest.raises(ValueError, match="LibOpenEvent record of 8 bytes"):
        events.decode(bytes([events.EventType.LIB_OPEN]) + bytes(7))
    with pytest.raises(ValueError, match="call record of 8 bytes"):
        events.decode_calls([events.call_record(events.CallEvent()), bytes([events.EventType.CALL]) + bytes(7)])


def test_bulk_call_decode_reads_every_field_where_ctypes_does() -> None:
    """The numpy view of a call record (CALL_DTYPE) and the ctypes struct agree field by field."""
    ev = events.CallEvent(type=events.EventType.CALL, flags=0x61, probe_id=513, pid=70000, tid=70001, depth=3,
                          call_id=2**64 - 2, parent_id=2**63 + 5, root_id=7, entry_ns=10**18, exit_ns=10**18 + 9,
                          ret=-35, out_value=2**64 - 1)
    for i in range(events.MAX_ARGS):
        ev.args[i] = (i + 1) * 0x0101010101010101
    ev.deref[:] = bytes(range(events.DEREF_BYTES))
    tail = b"name\0" + bytes(events.STR_BYTES - 5)
    (call, plain), rows = events.decode_calls([events.call_record(ev) + tail, events.call_record(events.CallEvent())])
    assert len(rows) == 2 and plain == events.Call(*([0] * 12), [0] * events.MAX_ARGS, bytes(events.DEREF_BYTES))
    for name in events.Call._fields:
        want = getattr(ev, name)
        assert getattr(call, name) == (bytes(want) if name == "deref" else list(want) if name == "args" else want), name
