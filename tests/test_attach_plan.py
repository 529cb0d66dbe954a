"""Attach plans as data, from the real libcudart's dynamic symbols and the real CPU libtorch's
operators: which group each probe lands in decides what the guardrail may cycle and what
attaches before what."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_eacgm.attach_plan import plan_catalog, plan_operators
from otel_eacgm.bpf_program import Tail
from otel_eacgm.probe_links import GroupKind
from otel_eacgm.probes import torch_ops
from otel_eacgm.probes.catalog import Family, Layer, enabled_rows
from otel_eacgm.probes.elf import ElfFile

cu13 = pytest.importorskip("nvidia.cu13", reason="the nvidia-cuda-runtime wheel (test dependency) is missing")
LIBCUDART = str(Path(list(cu13.__path__)[0]) / "lib" / "libcudart.so.13")


def cudart_offsets() -> dict[str, int]:
    with ElfFile(LIBCUDART) as elf:
        return {name.split("@")[0]: elf.file_offset(value) for name, value, _size in elf.dynamic_functions(b"cuda")}


def test_each_catalog_row_lands_in_the_group_its_spec_says() -> None:
    rows = enabled_rows(layers=frozenset({Layer.CUDA_RUNTIME}), launch_layer=Layer.CUDA_RUNTIME)
    offsets = cudart_offsets()
    plan = plan_catalog(rows, Family.CUDART, offsets.get)
    groups = dict(plan.groups)
    specs = dict(rows)
    launches = {specs[p.slot].symbol for p in groups[GroupKind.LAUNCH]}
    assert "cudaLaunchKernel" in launches
    assert all(not specs[p.slot].has_return for p in groups[GroupKind.LAUNCH])
    calls = groups[GroupKind.CALLS]
    assert {p.tail for p in calls if p.retprobe} == {Tail.RETURN} and {p.tail for p in calls if not p.retprobe} == {Tail.ENTRY}
    assert len([p for p in calls if p.retprobe]) == len([p for p in calls if not p.retprobe])
    assert plan.enqueues is not None
    assert plan.enqueues.returns[0] is GroupKind.ENQUEUE_RETURN and plan.enqueues.entries[0] is GroupKind.ENQUEUE
    assert {specs[p.slot].symbol for p in plan.enqueues.entries[1]} == {"cudaMemsetAsync"}
    assert all(p.retprobe for p in plan.enqueues.returns[1])
    placed = [p for _, probes in plan.groups for p in probes if not p.retprobe] + list(plan.enqueues.entries[1])
    cudart_rows = [spec for _, spec in rows if spec.family is Family.CUDART]
    assert len(placed) + len(plan.missing) == len(cudart_rows)  # every row once, or reported missing
    assert all(p.offset == offsets[specs[p.slot].symbol] for p in placed)


def test_a_symbol_this_version_lacks_is_reported_not_planned() -> None:
    rows = enabled_rows(layers=frozenset({Layer.CUDA_RUNTIME}), launch_layer=Layer.CUDA_RUNTIME)
    offsets = cudart_offsets()
    plan = plan_catalog(rows, Family.CUDART, lambda s: None if s == "cudaLaunchKernel" else offsets.get(s))
    assert "cudaLaunchKernel" in plan.missing
    specs = dict(rows)
    assert "cudaLaunchKernel" not in {specs[p.slot].symbol for _, probes in plan.groups for p in probes}


def test_rows_of_another_family_are_left_out() -> None:
    rows = enabled_rows(layers=frozenset({Layer.NCCL}), launch_layer=Layer.CUDA_RUNTIME)
    plan = plan_catalog(rows, Family.CUDART, lambda _s: 0x1000)
    assert all(not probes for _, probes in plan.groups) and plan.enqueues is None and not plan.missing


def test_operator_exits_pair_with_entries_and_unslotted_operators_are_named() -> None:
    torch = pytest.importorskip("torch")
    lib = str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")
    st = os.stat(lib)
    ops, _dropped = torch_ops.select(torch_ops.discover(lib, (st.st_dev, st.st_ino)), ("add_", "mm"), (), 4)
    ops = torch_ops.with_exits(lib, ops)
    slots = {op.struct: 500 + i for i, op in enumerate(ops[:-1])}  # the last one gets no slot
    pair, unslotted = plan_operators(ops, lambda op: slots.get(op.struct))
    assert unslotted == [ops[-1]]
    assert pair.returns[0] is GroupKind.TORCH_EXIT and pair.entries[0] is GroupKind.TORCH
    assert [p.offset for p in pair.entries[1]] == [op.file_offset for op in ops[:-1]]
    assert sorted(p.offset for p in pair.returns[1]) == sorted(e for op in ops[:-1] for e in op.exits)
    assert all(p.tail is Tail.RETURN and not p.retprobe for p in pair.returns[1])
