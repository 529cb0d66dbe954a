"""ATen operator discovery on the venv's real libtorch_cpu.so (no kernel needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_eacgm.probes import torch_ops

LIB = Path(__file__).resolve().parent.parent / ".venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"
pytestmark = pytest.mark.skipif(not LIB.exists(), reason="torch is not installed in .venv")


@pytest.fixture(scope="module")
def ops() -> tuple[torch_ops.TorchOp, ...]:
    return torch_ops.discover(str(LIB))


def test_names_and_overloads_come_from_the_library(ops) -> None:  # noqa: ANN001
    by_struct = {o.struct: o for o in ops}
    assert len(ops) > 2000
    assert (by_struct["add_Tensor"].name, by_struct["add_Tensor"].overload) == ("aten::add", "Tensor")
    assert (by_struct["add__Tensor"].name, by_struct["add__Tensor"].overload) == ("aten::add_", "Tensor")
    assert (by_struct["addmm"].name, by_struct["addmm"].overload) == ("aten::addmm", "")
    assert by_struct["sum_dim_IntList"].qualified == "aten::sum.dim_IntList"
    assert all(o.symbol.startswith("_ZN2at4_ops") and o.file_offset for o in ops)


def test_selection_order_patterns_and_cap(ops) -> None:  # noqa: ANN001
    chosen, dropped = torch_ops.select(ops, ["mm", "add*"], ["*.out", "*_out", "addmv*"], cap=3)
    assert [o.qualified for o in chosen] == ["aten::mm", "aten::mm.dtype", "aten::add.Scalar"]
    assert dropped > 5
    everything, _ = torch_ops.select(ops, torch_ops.DEFAULT_INCLUDE, torch_ops.DEFAULT_EXCLUDE, cap=10_000)
    names = {o.qualified for o in everything}
    assert {"aten::linear", "aten::addmm", "aten::_foreach_add_.List", "aten::convolution_backward"} <= names
    assert not any(o.overload == "out" for o in everything)


def test_every_selected_operator_has_return_points(ops) -> None:  # noqa: ANN001
    chosen, _ = torch_ops.select(ops, torch_ops.DEFAULT_INCLUDE, torch_ops.DEFAULT_EXCLUDE, cap=200)
    with_exits = torch_ops.with_exits(str(LIB), chosen)
    assert len(with_exits) == len(chosen)
    data = LIB.read_bytes()
    for op in with_exits:
        assert op.exits
        for off in op.exits:
            assert op.file_offset < off < op.file_offset + op.size
            assert data[off] in (0xC3, 0xE9, 0xEB)  # ret, jmp rel32, jmp rel8
