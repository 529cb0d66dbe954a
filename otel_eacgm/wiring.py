"""The agent's factory: one function that builds every part from the configuration and wires
them into a line (kernel program and probe links, discovery, record pipeline, export queue,
metrics, guardrail, self-telemetry). Nothing here runs; Agent.run does (agent.py).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_eacgm import __version__
from otel_eacgm.agent import Agent, raise_open_file_limit
from otel_eacgm.attach import Attacher, TorchSelection
from otel_eacgm.bpf_program import BpfError, CallProgram, ProgramOptions, Sampling, uprobe_multi_usable
from otel_eacgm.call_stats_reader import CallStatsReader
from otel_eacgm.clock import EpochClock
from otel_eacgm.config import AgentConfig
from otel_eacgm.decoders import DecodeContext
from otel_eacgm.discovery import Discovery
from otel_eacgm.endpoint_check import ExportDiagnosis
from otel_eacgm.export import (ProducingMetricExporter, SpanQueue, SpanSink, meter_provider, metric_exporter,
                               span_exporter)
from otel_eacgm.guardrail import Guardrail
from otel_eacgm.kernel_names import KernelNames
from otel_eacgm.launcher import Launcher
from otel_eacgm.pause_cycle import PauseCycle
from otel_eacgm.metrics.call_stats import CallStatistics
from otel_eacgm.metrics.host import start_host_metrics
from otel_eacgm.operator_shedding import OperatorShedder
from otel_eacgm.perfetto import NullMetricExporter, PerfettoExporter, TeeSpanExporter
from otel_eacgm.pipeline import RecordPipeline
from otel_eacgm.probe_links import ProbeLinks
from otel_eacgm.probes.catalog import Layer, ProbeSpec, Role, enabled_rows
from otel_eacgm.probes.libraries import cgroup_v2_identity
from otel_eacgm.probes.python_usdt import Rule, compile_rules
from otel_eacgm.pyframes.code_objects import CodeReader
from otel_eacgm.pyframes.frame_spans import FrameSpans
from otel_eacgm.pyframes.processes import FrameWalkers
from otel_eacgm.resources import agent_resource
from otel_eacgm.process_symbols import ProcessSymbols
from otel_eacgm.shaping import TraceShaper
from otel_eacgm.spans import SpanBuilder, error_type
from otel_eacgm.telemetry import AgentTelemetry

log = logging.getLogger(__name__)


def probe_rows(cfg: AgentConfig) -> list[tuple[int, ProbeSpec]]:
    """The catalog rows (slot, spec) of the configured layers; launches with returns if asked."""
    rows = enabled_rows(layers=frozenset(Layer(n) for n in cfg.layers), launch_layer=Layer(cfg.launch_layer))
    if cfg.launch_returns:
        rows = [(slot, dataclasses.replace(spec, has_return=True) if spec.role is Role.LAUNCH else spec)
                for slot, spec in rows]
    return rows


def _span_exporter(cfg: AgentConfig) -> SpanSink:
    exporters: list[SpanSink] = [span_exporter(cfg.protocol, cfg.endpoint, cfg.insecure, cfg.export_timeout_s)] \
        if cfg.otlp else []
    if cfg.perfetto:
        exporters.append(PerfettoExporter(cfg.perfetto))
    return exporters[0] if len(exporters) == 1 else TeeSpanExporter(exporters)


def _targets(cfg: AgentConfig, command: Sequence[str]) -> str:
    if not (cfg.pids or cfg.cgroup or command):
        return "all processes"
    return "targets " + (",".join(map(str, cfg.pids)) or cfg.cgroup or "command")


def _links_per_process(cfg: AgentConfig) -> bool:
    """Whether probes can be scoped to processes at a bearable cost: with uprobe_multi links
    (kernel 6.6+), one link per group and process, released at once. Perf events would take one
    event per probe and process, each released with its own kernel synchronisation (about
    0.1 s): seconds of the agent's loop for every exited child."""
    try:
        usable = cfg.uprobe_multi and uprobe_multi_usable()
    except BpfError:
        usable = False
    if not usable:
        log.info("probes stay on the library files (scoped_probes needs uprobe_multi links, kernel 6.6+): "
                 "processes outside the scope that map them take their traps")
    return usable


def build_agent(cfg: AgentConfig, command: Sequence[str] | None = None, *, dump_bpf: bool = False) -> Agent:
    """Load the BPF program and build the agent for `cfg` (and `command`, launched and traced)."""
    command = list(command or [])
    raise_open_file_limit()
    layers = frozenset(Layer(n) for n in cfg.layers)
    filtering = bool(cfg.pids or cfg.cgroup or command)
    scoped = filtering and cfg.scoped_probes and _links_per_process(cfg)
    # Without OTLP (a `trace` run) metrics go nowhere: neither count calls nor start the sources.
    metered = cfg.otlp
    host = socket.gethostname()

    # The kernel side: the program, its probe rows, the links that attach them.
    rows = probe_rows(cfg)
    specs = dict(rows)  # slot -> spec; discovered operators join it
    program = CallProgram(ProgramOptions(filter_pids=filtering, ringbuf_pages=cfg.ringbuf_pages,
                                         gate_opens=cfg.gate_opens if cfg.gate_opens is not None
                                         else bool(command) or scoped, hold_forks=scoped,
                                         cgroup=cgroup_v2_identity(Path(cfg.cgroup)) if cfg.cgroup else None,
                                         uprobe_multi=cfg.uprobe_multi),
                          dump=print if dump_bpf else None)
    for slot, spec in rows:
        program.configure(slot, spec)
    if Layer.PYTHON in layers:
        program.set_python_rules(*compile_rules(cfg.python_include, cfg.python_exclude,
                                                default_include=cfg.python_default_include))
    links = ProbeLinks(program)
    torch = TorchSelection(tuple(cfg.torch_include), tuple(cfg.torch_exclude), cfg.torch_max_ops) \
        if Layer.TORCH in layers else None
    code_reader = CodeReader()
    walkers = FrameWalkers(program, code_reader, cfg.python_frame_depth) if cfg.python_frames else None
    attacher = Attacher(program, links, rows, specs=specs, torch=torch, python=Layer.PYTHON in layers,
                        python_pid_scoped=filtering, frames=walkers, scoped=scoped)

    # Runtime launches name their kernels by the host stub's symbol; driver launches by name records.
    symbols = ProcessSymbols(eager=Layer(cfg.launch_layer) is Layer.CUDA_RUNTIME)
    kernel_names = KernelNames(symbols.resolve)
    call_stats = CallStatistics(specs, kernel_names, error_type, max_kernel_names=cfg.max_kernel_names) \
        if cfg.call_metrics and metered else None
    pause = PauseCycle(links, cfg.pause_cycle_s, Path(cfg.pause_cycle_log) if cfg.pause_cycle_log else None,
                       mark_gap=lambda on: program.set_cycle_gap("pause", on, every_probe=True)) if cfg.pause_cycle_s else None
    # The guardrail measures hit rates from the call statistics, so it needs them.
    guardrail = Guardrail(links, specs, read_stats=program.call_stats, budget=cfg.overhead_budget,
                          hit_cost_s=cfg.probe_hit_cost_us * 1e-6, period_s=cfg.guardrail_period_s,
                          min_duty=cfg.guardrail_min_duty, now=time.monotonic(),
                          mark_gap=lambda on: program.set_cycle_gap("guardrail", on),
                          clock=pause.traced_time if pause is not None else lambda t: t) \
        if cfg.overhead_budget > 0 and call_stats is not None else None
    hit_cost = guardrail.hit_cost if guardrail is not None else lambda _pid: cfg.probe_hit_cost_us * 1e-6
    shedder = OperatorShedder(links, specs, share=cfg.torch_shed_share, hit_cost=hit_cost, now=time.monotonic(),
                              mark_gap=lambda on: program.set_cycle_gap("shedding", on)) \
        if call_stats is not None and Layer.TORCH in layers and cfg.torch_shed_share > 0 else None
    stats_reader = CallStatsReader(program, call_stats, guardrail, metrics_interval_s=cfg.metrics_interval_s,
                                   guardrail_period_s=cfg.guardrail_period_s, shedder=shedder, pause=pause) \
        if call_stats is not None else None
    discovery = Discovery(program=program, attacher=attacher, symbols=symbols, kernel_names=kernel_names,
                          filtering=filtering, cgroup=cfg.cgroup, host_name=host,
                          resource_command_line=cfg.resource_command_line,
                          resource_environment=cfg.resource_environment,
                          on_gone=stats_reader.forget_later if stats_reader is not None else None)

    # The record line: builder -> shaper -> queue.
    clock = EpochClock()
    builder = SpanBuilder(specs, DecodeContext(kernel_names), clock, discovery.resource_for)
    diagnosis = ExportDiagnosis(cfg.protocol, cfg.endpoint, cfg.insecure) if cfg.otlp else None
    queue = SpanQueue(_span_exporter(cfg), max_size=cfg.queue_size, batch_size=cfg.batch_size,
                      on_failure=diagnosis.failed if diagnosis is not None else None)
    shaper = TraceShaper(queue.put, builder.ids, max_spans=cfg.trace_max_spans, max_delay_s=cfg.trace_max_delay_s,
                         slice_s=cfg.trace_slice_s, slow_s=cfg.span_slow_s)
    frames = None
    if walkers is not None:
        rules = [Rule.parse(p, True) for p in cfg.python_include] + [Rule.parse(p, False) for p in cfg.python_exclude]
        frames = walkers.spans = FrameSpans(
            code_reader, rules, cfg.python_default_include, builder.ids, clock, discovery.resource_for,
            lambda span, **kw: shaper.add(span, now=time.monotonic(), **kw))
    program.set_sampling(Sampling(
        ratio=cfg.span_sample_ratio, slow_s=cfg.span_slow_s, slice_s=cfg.trace_slice_s,
        resample_s=cfg.trace_max_delay_s, salt=builder.ids.salt, statistics=call_stats is not None,
        slice_max=cfg.span_slice_max))

    # Metrics: call statistics, self-telemetry, host sources.
    resource = agent_resource(host)
    exporter = metric_exporter(cfg.protocol, cfg.endpoint, cfg.insecure, cfg.export_timeout_s) if cfg.otlp \
        else NullMetricExporter()
    if call_stats is not None:
        exporter = ProducingMetricExporter(exporter, call_stats.metrics, resource,
                                           InstrumentationScope("otel_eacgm.metrics.calls", __version__),
                                           resource_for=discovery.known_resource)
    meters = meter_provider(exporter, cfg.metrics_interval_s, resource)
    telemetry = AgentTelemetry(program=program, links=links, attacher=attacher, queue=queue, shaper=shaper,
                               guardrail=guardrail, shedder=shedder)
    telemetry.register(meters)
    host_metrics = start_host_metrics(
        meters, gpu=cfg.gpu_metrics and metered, network=cfg.network_metrics and metered,
        tcp_retransmits=cfg.tcp_retransmits and metered,
        pid_filter=discovery.is_target if filtering else None,
        resource_for_pid=lambda pid: dict(discovery.resource_for(pid).attributes))

    pipeline = RecordPipeline(program=program, builder=builder, shaper=shaper, discovery=discovery,
                              call_stats=call_stats, rows=specs, counters=telemetry.counters, frames=frames)
    program.open_ring(pipeline.on_batch)
    return Agent(program=program, links=links, discovery=discovery, shaper=shaper, queue=queue, meters=meters,
                 host_metrics=host_metrics, telemetry=telemetry, call_stats=stats_reader,
                 launcher=Launcher(command, log_arguments=cfg.resource_command_line) if command else None, pids=list(cfg.pids),
                 ready_line=f"layers {','.join(cfg.layers)}, launches at {cfg.launch_layer}; {_targets(cfg, command)}",
                 scan_interval_s=cfg.scan_interval_s, stats_log_interval_s=cfg.stats_log_interval_s,
                 export_timeout_s=cfg.export_timeout_s, pause=pause, frames=frames,
                 frames_idle_s=cfg.trace_max_delay_s)
