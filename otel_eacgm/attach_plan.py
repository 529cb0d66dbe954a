"""Attach planning as pure data: which probes go on a library file, in which groups.

Inputs are the catalog rows of the file's family with their symbols' file offsets, the
discovered ATen operators with their exits and slots, or CPython's USDT notes; the output is the
groups the attacher hands to the probe links. Nothing here touches the kernel, so how probes
are grouped (what the guardrail may cycle, what must attach before what) is testable as data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from otel_eacgm.bpf_program import Tail
from otel_eacgm.probe_links import GroupKind, Probe
from otel_eacgm.probes.catalog import Family, ProbeSpec
from otel_eacgm.probes.python_usdt import PythonProbes
from otel_eacgm.probes.torch_ops import TorchOp


@dataclasses.dataclass(frozen=True)
class Pair:
    """Returns and entries of calls the guardrail cycles: the returns attach first (an entry seen
    without its return probe would leave a frame open), and both attach or neither."""

    returns: tuple[GroupKind, tuple[Probe, ...]]
    entries: tuple[GroupKind, tuple[Probe, ...]]


@dataclasses.dataclass(frozen=True)
class CatalogPlan:
    """The probes of one library file's catalog rows."""

    groups: tuple[tuple[GroupKind, tuple[Probe, ...]], ...]  # attached one by one, each on its own
    enqueues: Pair | None                                       # cyclable calls with a return probe
    missing: tuple[str, ...]                                    # symbols not in this version


def plan_catalog(rows: Sequence[tuple[int, ProbeSpec]], family: Family,
                 offset_of: Callable[[str], int | None]) -> CatalogPlan:
    """Group the rows of `family`: calls with a return probe (entry and uretprobe), entry-only
    launches (cyclable), and cyclable enqueue calls (entries and returns in groups of their own).
    `offset_of(symbol)` is the symbol's file offset, None when this version lacks it."""
    calls: list[Probe] = []
    launches: list[Probe] = []
    enqueues: list[Probe] = []
    enqueue_returns: list[Probe] = []
    missing: list[str] = []
    for slot, spec in rows:
        if spec.family is not family:
            continue
        offset = offset_of(spec.symbol)
        if offset is None:
            missing.append(spec.symbol)
        elif spec.cyclable:
            enqueues.append(Probe(offset, Tail.ENTRY, slot))
            enqueue_returns.append(Probe(offset, Tail.RETURN, slot, retprobe=True))
        elif spec.has_return:
            calls += [Probe(offset, Tail.ENTRY, slot), Probe(offset, Tail.RETURN, slot, retprobe=True)]
        else:
            launches.append(Probe(offset, Tail.ENTRY, slot))
    pair = Pair((GroupKind.ENQUEUE_RETURN, tuple(enqueue_returns)), (GroupKind.ENQUEUE, tuple(enqueues))) \
        if enqueues else None
    return CatalogPlan(((GroupKind.CALLS, tuple(calls)), (GroupKind.LAUNCH, tuple(launches))), pair, tuple(missing))


def plan_operators(ops: Sequence[TorchOp], slot_of: Callable[[TorchOp], int | None]) -> tuple[Pair, list[TorchOp]]:
    """Operator entries and the uprobes at their return instructions, as a cycled pair; and the
    operators left out for want of a slot (`slot_of` gives None)."""
    entries: list[Probe] = []
    exits: list[Probe] = []
    unslotted: list[TorchOp] = []
    for op in ops:
        slot = slot_of(op)
        if slot is None:
            unslotted.append(op)
            continue
        entries.append(Probe(op.file_offset, Tail.ENTRY, slot))
        exits += [Probe(offset, Tail.RETURN, slot) for offset in op.exits]
    return Pair((GroupKind.TORCH_EXIT, tuple(exits)), (GroupKind.TORCH, tuple(entries))), unslotted


def plan_python(probes: PythonProbes) -> tuple[Probe, ...]:
    """CPython's function__entry and function__return probes, with their USDT semaphores."""
    return (Probe(probes.entry_offset, Tail.PY_ENTRY, ref_ctr_offset=probes.entry_semaphore),
            Probe(probes.return_offset, Tail.PY_RETURN, ref_ctr_offset=probes.return_semaphore))
