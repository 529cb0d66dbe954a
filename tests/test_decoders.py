"""Argument decoding of call records (no BPF needed: records are built here)."""

from __future__ import annotations

import struct

from otel_eacgm.clock import EpochClock
from otel_eacgm.decoders import (DECODERS, DecodeContext, drv_launch_ex, free, get_kernel, malloc, nccl_allgather, rt_launch,
                                 rt_launch_ex)
from otel_eacgm.events import CallEvent, CallFlags, call_record, decode_calls
from otel_eacgm.kernel_names import KernelNames
from otel_eacgm.probes.catalog import CATALOG, MAX_SLOTS, Layer, enabled_rows
from otel_eacgm.spans import SpanBuilder, SpanIds


def _ctx() -> DecodeContext:
    return DecodeContext(KernelNames(lambda pid, addr: {0x400: "_Z4testv"}.get(addr)))


def _ev(*args: int, **kw: int) -> CallEvent:
    ev = CallEvent(pid=10, tid=11, **kw)
    for i, a in enumerate(args):
        ev.args[i] = a
    return ev


def test_every_catalog_row_has_a_decoder_and_a_slot() -> None:
    assert len(CATALOG) <= MAX_SLOTS
    assert all(row.decoder in DECODERS for row in CATALOG)
    assert len({(r.family, r.symbol) for r in CATALOG}) == len(CATALOG)


def test_launch_layer_selects_one_launch_probe_per_launch() -> None:
    driver = {s.symbol for _, s in enabled_rows(layers=frozenset(Layer), launch_layer=Layer.CUDA_DRIVER)}
    runtime = {s.symbol for _, s in enabled_rows(layers=frozenset(Layer), launch_layer=Layer.CUDA_RUNTIME)}
    assert "cuLaunchKernel" in driver and "cudaLaunchKernel" not in driver and "cuModuleGetFunction" in driver
    assert "cudaLaunchKernel" in runtime and "cuLaunchKernel" not in runtime and "cuModuleGetFunction" not in runtime
    assert "__cudaGetKernel" in runtime and "__cudaGetKernel" not in driver


def test_runtime_launches_by_handle_take_the_name_of_the_stub_it_was_made_for() -> None:
    """nvcc 12.8+: __cudaGetKernel(&handle, stub) once, then cudaLaunchKernel(handle, ...)."""
    ctx = _ctx()
    assert rt_launch(_ev(0x5A5A0), None, ctx)["cuda.kernel.name"] == "[unknown]"  # before the record
    failed = _ev(0, 0x400, flags=CallFlags.RETURNED | CallFlags.OUT, out_value=0x6B6B0, ret=35)
    assert get_kernel(failed, None, ctx)["cuda.kernel.name"] == "test()"
    assert rt_launch(_ev(0x6B6B0), None, ctx)["cuda.kernel.name"] == "[unknown]"  # a failed call names nothing
    ok = _ev(0, 0x400, flags=CallFlags.RETURNED | CallFlags.OUT, out_value=0x5A5A0)
    assert get_kernel(ok, None, ctx)["cuda.kernel.name"] == "test()"
    assert rt_launch(_ev(0x5A5A0), None, ctx)["cuda.kernel.name"] == "test()"
    other_process = _ev(0x5A5A0)
    other_process.pid = 99
    assert rt_launch(other_process, None, ctx)["cuda.kernel.name"] == "[unknown]"


def test_struct_pointer_launches_decode_full_width_fields() -> None:
    ev = _ev(0, 0x400)
    raw = struct.pack("<6IQQ", 70000, 2, 3, 1024, 1, 1, 65536, 0xABC)  # 70000 does not fit 16 bits
    ev.deref[:] = raw
    a = rt_launch_ex(ev, None, _ctx())
    assert a["cuda.grid"] == [70000, 2, 3] and a["cuda.shared_mem.bytes"] == 65536 and a["cuda.stream"] == "0xabc"
    assert a["cuda.kernel.name"] == "test()"
    ev2 = _ev(0, 0x999)
    ev2.deref[:] = struct.pack("<7IIQ", 1, 2, 3, 4, 5, 6, 99, 0, 0x55)
    b = drv_launch_ex(ev2, None, _ctx())
    assert b["cuda.block"] == [4, 5, 6] and b["cuda.shared_mem.bytes"] == 99 and b["cuda.kernel.name"] == "[unknown]"


def test_allocation_sizes_follow_the_pointer_to_free() -> None:
    ctx = _ctx()
    m = _ev(0x1000, 4096, flags=CallFlags.RETURNED | CallFlags.OUT, out_value=0xBEEF)
    assert malloc(m, None, ctx)["cuda.memory.address"] == "0xbeef"
    f = free(_ev(0xBEEF), None, ctx)
    assert f["cuda.memory.bytes"] == 4096
    assert "cuda.memory.bytes" not in free(_ev(0xBEEF), None, ctx)  # freed once


def test_nccl_bytes_are_count_times_datatype_size() -> None:
    a = nccl_allgather(_ev(0, 0, 10, 6, 0x77, 0x88), None, _ctx())
    assert (a["nccl.datatype"], a["nccl.bytes"], a["nccl.comm"]) == ("float16", 20, "0x77")
    unknown = nccl_allgather(_ev(0, 0, 10, 42, 0, 0), None, _ctx())
    assert unknown["nccl.datatype"] == "type42" and "nccl.bytes" not in unknown


def test_span_ids_parenting_and_epoch_times() -> None:
    rows = dict(enumerate(CATALOG))
    slot = next(i for i, r in rows.items() if r.symbol == "cudaMalloc")
    clock = EpochClock()
    clock.offset_ns = 1_000
    from opentelemetry.sdk.resources import Resource

    ids = SpanIds(salt=7)
    b = SpanBuilder(rows, _ctx(), clock, lambda pid: Resource({"process.pid": pid}), ids)
    records = [_ev(0, 64, probe_id=slot, call_id=5, parent_id=4, root_id=4, entry_ns=10, exit_ns=20,
                   flags=CallFlags.RETURNED, ret=2),
               _ev(0, 64, probe_id=slot, call_id=4, root_id=4, entry_ns=5, exit_ns=30, flags=CallFlags.RETURNED)]
    calls, view = decode_calls([call_record(r) for r in records])
    span_ids, parent_ids = ids.span_ids(view["call_id"]), ids.span_ids(view["parent_id"])
    assert span_ids == [ids.span_id(5), ids.span_id(4)] and parent_ids == [ids.span_id(4), 0]  # bulk == one by one
    child, parent = (b.build(c, s, p) for c, s, p in zip(calls, span_ids, parent_ids))
    assert child.parent_span_id == parent.span_id
    assert (child.start, child.end) == (1_010, 1_020)
    assert child.error == "cudaMalloc returned cudaErrorMemoryAllocation (2)"
    assert child.all_attributes()["error.type"] == "cudaErrorMemoryAllocation"
    assert parent.parent_span_id == 0 and parent.error is None
