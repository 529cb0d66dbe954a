"""Declarative observable instruments: a name, a kind, a unit and a function that observes.

Each metrics source (NVML, ``/proc/net/dev``, InfiniBand sysfs, the TCP BPF maps) describes its
instruments as :class:`ObservableSpec` rows and registers them with :func:`register`. Keeping
the rows in one table per source is what ``docs/semantic-conventions.md`` is checked against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from opentelemetry.metrics import CallbackOptions, Meter, Observation


class Kind(Enum):
    """OTel asynchronous instrument kinds."""

    GAUGE = "gauge"
    COUNTER = "counter"
    UP_DOWN_COUNTER = "updowncounter"


@dataclass(frozen=True)
class ObservableSpec:
    """One instrument: ``observe`` returns its observations for one collection."""

    name: str
    kind: Kind
    unit: str
    description: str
    observe: Callable[[], Iterable[Observation]]


def register(meter: Meter, specs: Sequence[ObservableSpec], is_open: Callable[[], bool]) -> None:
    """Create each instrument on ``meter``; once ``is_open()`` is False they observe nothing.

    OTel Python cannot unregister an instrument, so closing a source turns its callbacks into
    no-ops instead of leaving them reading released handles.
    """
    create = {
        Kind.GAUGE: meter.create_observable_gauge,
        Kind.COUNTER: meter.create_observable_counter,
        Kind.UP_DOWN_COUNTER: meter.create_observable_up_down_counter,
    }
    for spec in specs:
        create[spec.kind](
            spec.name,
            callbacks=[_guarded(spec.observe, is_open)],
            unit=spec.unit,
            description=spec.description,
        )


def _guarded(
    observe: Callable[[], Iterable[Observation]], is_open: Callable[[], bool]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return list(observe()) if is_open() else []

    return callback
