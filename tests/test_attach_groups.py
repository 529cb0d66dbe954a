"""How the attacher groups probes, on the real CPU libtorch and a program that records instead
of touching the kernel: operator exits go first, and exits whose entries could not be attached
are taken off again (they would cost probe hits and trace nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_eacgm.attach import Attacher, TorchSelection
from otel_eacgm.bpf_loader import BpfError, Group, GroupKind
from otel_eacgm.probes.catalog import Family
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
    return Attacher(program, [], torch=TorchSelection(include=("add_", "mm"), max_ops=4))  # type: ignore[arg-type]


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
