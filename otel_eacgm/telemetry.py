"""The agent's self-telemetry: what it captured, exported and lost, as metrics and one log line.

Every count here is read where it is kept (the kernel's stats map, the export queue, the trace
shaper, the probe links, the guardrail), so the metrics and the summary line cannot disagree.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from otel_eacgm import __version__
from otel_eacgm.attach import Attacher
from otel_eacgm.bpf_program import CallProgram
from otel_eacgm.events import Stat
from otel_eacgm.export import SpanQueue
from otel_eacgm.guardrail import Guardrail
from otel_eacgm.operator_shedding import OperatorShedder
from otel_eacgm.probe_links import ProbeLinks
from otel_eacgm.shaping import TraceShaper


@dataclasses.dataclass
class Counters:
    """Counts kept in the agent's Python (the rest are read from where they are kept)."""

    calls: int = 0
    incomplete: int = 0
    decode_errors: int = 0


def _observe(fn: Callable[[], Iterable[Observation]]) -> list[Callable[[CallbackOptions], Iterable[Observation]]]:
    return [lambda _options: list(fn())]


class AgentTelemetry:
    """Reads the agent's counters; registers them as OTel instruments and writes the summary."""

    def __init__(self, *, program: CallProgram, links: ProbeLinks, attacher: Attacher, queue: SpanQueue,
                 shaper: TraceShaper, guardrail: Guardrail | None, shedder: OperatorShedder | None = None) -> None:
        self.counters = Counters()
        self._shedder = shedder
        self._program = program
        self._links = links
        self._attacher = attacher
        self._queue = queue
        self._shaper = shaper
        self._guardrail = guardrail

    def captured(self, stats: dict[Stat, int] | None = None) -> int:
        """Calls the probes saw: received as records, or counted in the kernel and not sent."""
        stats = stats if stats is not None else self._program.stats()
        return self.counters.calls + stats[Stat.SAMPLED_OUT]

    def sampled_out(self, stats: dict[Stat, int] | None = None) -> int:
        """Calls not exported as spans by sampling: in the kernel, or by the shaper."""
        stats = stats if stats is not None else self._program.stats()
        return stats[Stat.SAMPLED_OUT] + self._shaper.counters.sampled_out

    def summary(self) -> str:
        """One line with every self-telemetry counter (the agent's `stats:` and `done:` lines)."""
        stats = self._program.stats()
        queue, shaper = self._queue, self._shaper.counters
        return (f"calls={self.captured(stats)} received={self.counters.calls} exported={queue.exported} "
                f"queued={len(queue)} "
                f"dropped_export={queue.dropped} dropped_ringbuf={stats[Stat.RINGBUF_DROPS]} "
                f"export_failures={queue.export_failures} incomplete={self.counters.incomplete} "
                f"depth_overflow={stats[Stat.DEPTH_OVERFLOW]} unmatched_returns={stats[Stat.UNMATCHED_RETURN]} "
                f"cycled_returns={stats[Stat.CYCLED_RETURN]} "
                f"probes={self._links.probe_count} files={len(self._attacher.files)} "
                f"short_lived={self._attacher.short_lived.count} "
                f"shed_ops={len(self._shedder.shed) if self._shedder is not None else 0} "
                f"root_spans={shaper.root_spans} traces={shaper.traces} split={shaper.split} "
                f"sampled_out={self.sampled_out(stats)} held={shaper.held}")

    def register(self, meters: MeterProvider) -> None:
        """Create the `eacgm.agent.*` instruments (docs/semantic-conventions.md) on `meters`."""
        meter = meters.get_meter("otel-eacgm.agent", __version__)
        queue = self._queue
        meter.create_observable_counter("eacgm.agent.calls", _observe(lambda: [Observation(self.captured())]),
                                        unit="{call}", description="Calls captured by the probes")
        meter.create_observable_counter(
            "eacgm.agent.sampled_out", _observe(lambda: [Observation(self.sampled_out())]),
            unit="{call}", description="Calls captured but not exported as spans (outside the span sample)")
        meter.create_observable_counter(
            "eacgm.agent.spans.exported", _observe(lambda: [Observation(queue.exported)]),
            unit="{span}", description="Spans accepted by the OTLP endpoint")
        meter.create_observable_counter(
            "eacgm.agent.dropped", _observe(lambda: [
                Observation(queue.dropped, {"eacgm.drop.reason": "export"}),
                Observation(self._program.stats()[Stat.RINGBUF_DROPS], {"eacgm.drop.reason": "ringbuf"}),
            ]), unit="{event}", description="Events lost, by reason")
        meter.create_observable_counter(
            "eacgm.agent.export.failures", _observe(lambda: [Observation(queue.export_failures)]),
            unit="{request}", description="Failed span export requests")
        meter.create_observable_gauge(
            "eacgm.agent.probes", _observe(lambda: [Observation(self._links.probe_count)]),
            unit="{probe}", description="Uprobes and uretprobes attached")
        meter.create_observable_counter(
            "process.cpu.time", _observe(lambda: [
                Observation(t, {"cpu.mode": mode}) for mode, t in zip(("user", "system"), os.times()[:2])]),
            unit="s", description="CPU time of the agent process (its own cost, beside the probes' estimate)")
        if self._guardrail is not None:
            self._register_guardrail(meter, self._guardrail)
        if self._shedder is not None:
            shedder = self._shedder
            meter.create_observable_gauge(
                "eacgm.agent.operators.shed", _observe(lambda: [
                    Observation(rate, {"code.function.name": name}) for name, rate in shedder.shed_rates().items()]),
                unit="{call}/s", description="Operators no longer probed because their probes cost more than their "
                                             "spans tell: calls per second each had when it was shed")

    @staticmethod
    def _register_guardrail(meter: Meter, g: Guardrail) -> None:
        meter.create_observable_gauge(
            "eacgm.agent.overhead.estimate", _observe(lambda: [
                Observation(v, {"process.pid": pid}) for pid, v in g.estimates.items()]),
            unit="1", description="Estimated probe cost of a traced process with every probe attached "
                                  "(share of a thread's time)")
        meter.create_observable_gauge(
            "eacgm.agent.probe.duty", _observe(lambda: [
                Observation(v, {"code.function.name": name}) for name, v in g.duties().items()]),
            unit="1", description="Share of the time a probe cycled by the overhead guardrail is attached")
        meter.create_observable_gauge(
            "eacgm.agent.probe.hit_cost", _observe(lambda: [
                Observation(v, {"process.pid": pid}) for pid, v in g.hit_costs().items()]),
            unit="s", description="Cost of one probe hit the guardrail uses for a traced process: probe_hit_cost_us, "
                                  "or what it measured from the process' slowdown while cycled probes were attached, "
                                  "if higher")
