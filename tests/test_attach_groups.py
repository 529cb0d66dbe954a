"""How the attacher groups probes, on the real CPU libtorch (and the catalog's CUDA runtime rows)
and a program that records instead of touching the kernel: operator exits and enqueue returns
go first, and returns whose entries could not be attached are taken off again (they would cost
probe hits and trace nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_eacgm.attach import Attacher, TorchSelection
from otel_eacgm.bpf_program import BpfError
from otel_eacgm.probe_links import Group, GroupKind
from otel_eacgm.probes.catalog import CATALOG, Family
from otel_eacgm.probes.libraries import MappedLibrary

torch = pytest.importorskip("torch")
LIBTORCH = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"


class RecordingProgram:
    def __init__(self, refuse: GroupKind | None = None) -> None:
        self.refuse = refuse
        self.attached: list[Group] = []
        self.forgotten: list[Group] = []

    def configure(self, _slot: int, _spec: object) -> None:
        pass

    @property
    def probe_count(self) -> int:
        return 0

    def attach(self, group: Group, probes: list, *, label: str = "") -> None:
        if group.kind is self.refuse:
            raise BpfError(f"{label}: refused")
        assert probes
        self.attached.append(group)

    def forget(self, group: Group) -> None:
        self.forgotten.append(group)


def torch_lib() -> MappedLibrary:
    st = os.stat(LIBTORCH)
    return MappedLibrary(Family.TORCH, str(LIBTORCH), (st.st_dev, st.st_ino))


def attacher(program: RecordingProgram) -> Attacher:
    return Attacher(program, program, [], torch=TorchSelection(include=("add_", "mm"), max_ops=4))  # type: ignore[arg-type]


def test_operator_exits_are_attached_before_their_entries() -> None:
    program = RecordingProgram()
    attacher(program).ensure(torch_lib())
    assert [g.kind for g in program.attached] == [GroupKind.TORCH_EXIT, GroupKind.TORCH]
    assert program.forgotten == []


def test_exits_are_taken_off_when_their_entries_fail() -> None:
    program = RecordingProgram(refuse=GroupKind.TORCH)
    a = attacher(program)
    a.ensure(torch_lib())
    assert program.forgotten == [Group(GroupKind.TORCH_EXIT, str(LIBTORCH))]
    assert a.failed[str(LIBTORCH)]  # the operators are reported as not traced


class ResolvingProgram(RecordingProgram):
    """Every catalog symbol resolves (at a made-up offset): the grouping is what is checked."""

    def resolve(self, _path: str, symbol: str) -> int:
        return 0x1000 + 16 * sum(map(ord, symbol))


def runtime_attacher(program: RecordingProgram) -> tuple[Attacher, MappedLibrary]:
    rows = [(slot, spec) for slot, spec in enumerate(CATALOG) if spec.family is Family.CUDART]
    return Attacher(program, program, rows), MappedLibrary(Family.CUDART, "/opt/libcudart.so.13", (1, 2))  # type: ignore[arg-type]


def test_enqueue_calls_get_groups_of_their_own_returns_first() -> None:
    """cudaMemsetAsync (a cyclable row) is attached apart from the other calls with returns, its
    return probe's group before its entry's: the guardrail cycles the pair like operators."""
    program = ResolvingProgram()
    a, lib = runtime_attacher(program)
    a.ensure(lib)
    kinds = [g.kind for g in program.attached]
    assert kinds.index(GroupKind.ENQUEUE_RETURN) < kinds.index(GroupKind.ENQUEUE)
    assert {GroupKind.CALLS, GroupKind.LAUNCH} <= set(kinds) and program.forgotten == []


def test_enqueue_returns_are_taken_off_when_their_entries_fail() -> None:
    program = ResolvingProgram(refuse=GroupKind.ENQUEUE)
    a, lib = runtime_attacher(program)
    a.ensure(lib)
    assert program.forgotten == [Group(GroupKind.ENQUEUE_RETURN, lib.path)]
    assert a.failed[lib.path] == ["cudaMemsetAsync"]


def test_enqueue_entries_are_not_attached_without_their_returns() -> None:
    program = ResolvingProgram(refuse=GroupKind.ENQUEUE_RETURN)
    a, lib = runtime_attacher(program)
    a.ensure(lib)
    assert GroupKind.ENQUEUE not in [g.kind for g in program.attached]
    assert a.failed[lib.path] == ["cudaMemsetAsync"]
