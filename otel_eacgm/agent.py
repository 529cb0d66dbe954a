"""The agent: discover processes and libraries, attach probes, stream call records as spans.

One thread polls the BPF ring buffer and turns records into spans (consumed in the agent's
process, never in the traced one); the export thread (export.SpanQueue) ships them. Discovery
runs between polls: a full /proc scan every scan_interval_s, and at once when a traced process
opens a watched library (the BPF open watch), so a library mapped after start is traced within
milliseconds, or before its first call when gating is on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_eacgm import __version__
from otel_eacgm.attach import Attacher, TorchSelection
from otel_eacgm.bpf_loader import POLL_BATCH, CallProgram, ProgramOptions, Sampling, import_bcc
from otel_eacgm.clock import EpochClock
from otel_eacgm.config import AgentConfig
from otel_eacgm.decoders import DecodeContext
from otel_eacgm.events import (CallEvent, CallFlags, CallStrEvent, ExecEvent, LibOpenEvent, PyCallEvent, Stat,
                               ThreadExitEvent, decode)
from otel_eacgm.export import ProducingMetricExporter, SpanQueue, meter_provider, metric_exporter, span_exporter
from otel_eacgm.guardrail import Guardrail
from otel_eacgm.kernel_names import KernelNames
from otel_eacgm.metrics.call_stats import CallStatistics
from otel_eacgm.metrics.host import start_host_metrics
from otel_eacgm.perfetto import NullMetricExporter, PerfettoExporter, TeeSpanExporter
from otel_eacgm.probes.catalog import Layer, Role, enabled_rows
from otel_eacgm.probes.python_usdt import compile_rules
from otel_eacgm.probes.libraries import all_pids, cgroup_pids, family_of, libraries_of, resolve
from otel_eacgm.process_symbols import ProcessSymbols
from otel_eacgm.resources import process_resource
from otel_eacgm.shaping import TraceShaper
from otel_eacgm.spans import SpanBuilder, error_type

log = logging.getLogger(__name__)

_RESCAN_DELAYS_S = (0.0, 0.05, 0.3, 1.0)  # after an open: the mmap follows the openat


def raise_open_file_limit() -> int:
    """Lift the soft open-file limit to the hard one; the new soft limit.

    Perf-event probes take one file each, and a process's symbol cache one per mapped library:
    a few traced PyTorch processes pass the 1024 that systemd gives a service by default.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft


@dataclasses.dataclass
class Counters:
    """Self-telemetry: what was captured, exported and lost."""

    calls: int = 0
    incomplete: int = 0
    decode_errors: int = 0
    library_opens: int = 0


class Agent:
    """Runs until stopped (or until the launched command exits)."""

    def __init__(self, cfg: AgentConfig, command: Sequence[str] | None = None, *, dump_bpf: bool = False) -> None:
        self.cfg = cfg
        self.command = list(command or [])
        raise_open_file_limit()
        self.counters = Counters()
        self._stop = False
        self._child: subprocess.Popen[bytes] | None = None
        self._resources: dict[int, Resource] = {}
        self._host = socket.gethostname()
        self._pending_scans: list[tuple[float, int]] = []
        self._stats_forget: list[tuple[float, int]] = []
        filtering = bool(cfg.pids or cfg.cgroup or self.command)
        gate = cfg.gate_opens if cfg.gate_opens is not None else bool(self.command)
        layers = frozenset(Layer(n) for n in cfg.layers)
        rows = enabled_rows(layers=layers, launch_layer=Layer(cfg.launch_layer))
        if cfg.launch_returns:
            rows = [(slot, dataclasses.replace(spec, has_return=True) if spec.role is Role.LAUNCH else spec)
                    for slot, spec in rows]
        self.rows = dict(rows)
        self.program = CallProgram(ProgramOptions(filter_pids=filtering, gate_opens=gate, ringbuf_pages=cfg.ringbuf_pages,
                                                  uprobe_multi=cfg.uprobe_multi),
                                   dump=print if dump_bpf else None)
        for slot, spec in rows:
            self.program.configure(slot, spec)
        torch = TorchSelection(tuple(cfg.torch_include), tuple(cfg.torch_exclude), cfg.torch_max_ops) \
            if Layer.TORCH in layers else None
        self.attacher = Attacher(self.program, rows, specs=self.rows, torch=torch, python=Layer.PYTHON in layers,
                                 python_pid_scoped=filtering)
        if Layer.PYTHON in layers:
            self.program.set_python_rules(*compile_rules(cfg.python_include, cfg.python_exclude,
                                                         default_include=cfg.python_default_include))
        self.filtering = filtering
        # Runtime launches name their kernels by the host stub's symbol; driver launches by name records.
        self.symbols = ProcessSymbols(import_bcc(), eager=Layer(cfg.launch_layer) is Layer.CUDA_RUNTIME)
        self.kernel_names = KernelNames(self.symbols.resolve)
        self.builder = SpanBuilder(self.rows, DecodeContext(self.kernel_names), EpochClock(), self._resource_for)
        exporters = [span_exporter(cfg.protocol, cfg.endpoint, cfg.insecure, cfg.export_timeout_s)] if cfg.otlp else []
        if cfg.perfetto:
            exporters.append(PerfettoExporter(cfg.perfetto))
        self.queue = SpanQueue(
            exporters[0] if len(exporters) == 1 else TeeSpanExporter(exporters),
            max_size=cfg.queue_size, batch_size=cfg.batch_size,
        )
        self.shaper = TraceShaper(self.queue.put, self.builder.ids, max_spans=cfg.trace_max_spans,
                                  max_delay_s=cfg.trace_max_delay_s, slice_s=cfg.trace_slice_s,
                                  slow_s=cfg.span_slow_s)
        # Without OTLP (a `trace` run) metrics go nowhere: neither count calls nor start the sources.
        metered = cfg.otlp
        self.call_stats = CallStatistics(self.rows, self.kernel_names, error_type,
                                         max_kernel_names=cfg.max_kernel_names) if cfg.call_metrics and metered else None
        self.program.set_sampling(Sampling(
            ratio=cfg.span_sample_ratio, slow_s=cfg.span_slow_s, slice_s=cfg.trace_slice_s,
            resample_s=cfg.trace_max_delay_s, salt=self.builder.ids.salt, statistics=self.call_stats is not None,
            slice_max=cfg.span_slice_max))
        resource = Resource({"service.name": "otel-eacgm-agent", "host.name": self._host, "process.pid": os.getpid(),
                             "service.version": __version__})
        exporter = metric_exporter(cfg.protocol, cfg.endpoint, cfg.insecure, cfg.export_timeout_s) if cfg.otlp \
            else NullMetricExporter()
        if self.call_stats is not None:
            exporter = ProducingMetricExporter(exporter, self.call_stats.metrics, resource,
                                               InstrumentationScope("otel_eacgm.metrics.calls", __version__))
        self._meters = meter_provider(exporter, cfg.metrics_interval_s, resource)
        # The guardrail measures hit rates from the call statistics, so it needs them.
        self.guardrail = Guardrail(self.program, self.rows, budget=cfg.overhead_budget,
                                   hit_cost_s=cfg.probe_hit_cost_us * 1e-6, period_s=cfg.guardrail_period_s,
                                   min_duty=cfg.guardrail_min_duty, now=time.monotonic()) \
            if cfg.overhead_budget > 0 and self.call_stats is not None else None
        # Half a metric interval keeps the exported counts fresh; the guardrail wants a first
        # read sooner, so that a launch-bound job is throttled within a second or two.
        self._stats_every = self.cfg.metrics_interval_s / 2 if self.guardrail is None \
            else min(self.cfg.metrics_interval_s / 2, self.cfg.guardrail_period_s / 2)
        self._register_metrics()
        self.host_metrics = start_host_metrics(
            self._meters, gpu=cfg.gpu_metrics and metered, network=cfg.network_metrics and metered,
            tcp_retransmits=cfg.tcp_retransmits and metered,
            pid_filter=self._is_target if filtering else None,
            resource_for_pid=lambda pid: dict(self._resource_for(pid).attributes))
        self.program.open_ring(self._on_record)

    # --- self-telemetry -------------------------------------------------------------------
    def _register_metrics(self) -> None:
        meter = self._meters.get_meter("otel-eacgm.agent", __version__)

        def observe(fn):  # noqa: ANN001, ANN202
            def callback(_options: CallbackOptions) -> list[Observation]:
                return fn()
            return [callback]

        meter.create_observable_counter("eacgm.agent.calls", observe(lambda: [Observation(self.captured())]),
                                        unit="{call}", description="Calls captured by the probes")
        meter.create_observable_counter(
            "eacgm.agent.sampled_out", observe(lambda: [Observation(self.sampled_out())]),
            unit="{call}", description="Calls captured but not exported as spans (outside the span sample)")
        meter.create_observable_counter(
            "eacgm.agent.spans.exported", observe(lambda: [Observation(self.queue.exported)]),
            unit="{span}", description="Spans accepted by the OTLP endpoint")
        meter.create_observable_counter(
            "eacgm.agent.dropped", observe(lambda: [
                Observation(self.queue.dropped, {"eacgm.drop.reason": "export"}),
                Observation(self.program.stats()[Stat.RINGBUF_DROPS], {"eacgm.drop.reason": "ringbuf"}),
            ]), unit="{event}", description="Events lost, by reason")
        meter.create_observable_counter(
            "eacgm.agent.export.failures", observe(lambda: [Observation(self.queue.export_failures)]),
            unit="{request}", description="Failed span export requests")
        meter.create_observable_gauge(
            "eacgm.agent.probes", observe(lambda: [Observation(self.program.probe_count)]),
            unit="{probe}", description="Uprobes and uretprobes attached")
        meter.create_observable_counter(
            "process.cpu.time", observe(lambda: [
                Observation(t, {"cpu.mode": mode}) for mode, t in zip(("user", "system"), os.times()[:2])]),
            unit="s", description="CPU time of the agent process (its own cost, beside the probes' estimate)")
        if self.guardrail is not None:
            g = self.guardrail
            meter.create_observable_gauge(
                "eacgm.agent.overhead.estimate", observe(lambda: [
                    Observation(v, {"process.pid": pid}) for pid, v in g.estimates.items()]),
                unit="1", description="Estimated probe cost of a traced process with every probe attached (share of a thread's time)")
            meter.create_observable_gauge(
                "eacgm.agent.probe.duty", observe(lambda: [
                    Observation(v, {"code.function.name": name}) for name, v in g.duties().items()]),
                unit="1", description="Share of the time a probe cycled by the overhead guardrail is attached")
            meter.create_observable_gauge(
                "eacgm.agent.probe.hit_cost", observe(lambda: [
                    Observation(v, {"process.pid": pid}) for pid, v in g.hit_costs().items()]),
                unit="s", description="Cost of one probe hit the guardrail uses for a traced process: probe_hit_cost_us, "
                                      "or what it measured from the process' slowdown while cycled probes were attached, if higher")

    def summary(self) -> str:
        """One line with every self-telemetry counter."""
        stats = self.program.stats()
        return (f"calls={self.captured(stats)} received={self.counters.calls} exported={self.queue.exported} "
                f"queued={len(self.queue)} "
                f"dropped_export={self.queue.dropped} dropped_ringbuf={stats[Stat.RINGBUF_DROPS]} "
                f"export_failures={self.queue.export_failures} incomplete={self.counters.incomplete} "
                f"depth_overflow={stats[Stat.DEPTH_OVERFLOW]} unmatched_returns={stats[Stat.UNMATCHED_RETURN]} "
                f"probes={self.program.probe_count} files={len(self.attacher.files)} "
                f"traces={self.shaper.counters.traces} split={self.shaper.counters.split} "
                f"sampled_out={self.sampled_out(stats)} held={self.shaper.counters.held}")

    def captured(self, stats: dict[Stat, int] | None = None) -> int:
        """Calls the probes saw: received as records, or counted in the kernel and not sent."""
        stats = stats if stats is not None else self.program.stats()
        return self.counters.calls + stats[Stat.SAMPLED_OUT]

    def sampled_out(self, stats: dict[Stat, int] | None = None) -> int:
        """Calls not exported as spans by sampling: in the kernel, or by the shaper."""
        stats = stats if stats is not None else self.program.stats()
        return stats[Stat.SAMPLED_OUT] + self.shaper.counters.sampled_out

    def _is_target(self, pid: int) -> bool:
        """Per-process host metrics (GPU memory, retransmits) follow the traced processes."""
        return pid in self.program.targets()

    # --- resources ------------------------------------------------------------------------
    def _resource_for(self, pid: int) -> Resource:
        res = self._resources.get(pid)
        if res is None:
            res = self._resources[pid] = process_resource(
                pid, host_name=self._host, command_line=self.cfg.resource_command_line,
                environment=self.cfg.resource_environment)
            self.symbols.track(pid)  # its map, read while it lives, names its launches
        return res

    # --- ring buffer records --------------------------------------------------------------
    def _on_record(self, data: int, size: int) -> None:
        try:
            rec = decode(data, size)
            if isinstance(rec, PyCallEvent):
                self._on_call(rec.call, None, rec)
            elif isinstance(rec, CallStrEvent):
                self._on_call(rec.call, rec.str)
            elif isinstance(rec, CallEvent):
                self._on_call(rec, None)
            elif isinstance(rec, LibOpenEvent):
                self._on_lib_open(rec)
            elif isinstance(rec, ThreadExitEvent):
                self._on_thread_exit(rec)
            elif isinstance(rec, ExecEvent):
                self._on_exec(rec)
        except Exception:  # one bad record must not stop the capture loop
            self.counters.decode_errors += 1
            log.exception("dropping an undecodable ring-buffer record (%d bytes)", size)

    def _on_call(self, ev: CallEvent, string: bytes | None, py: PyCallEvent | None = None) -> None:
        self.counters.calls += 1
        self._resource_for(ev.pid)
        span = self.builder.build_record(py if py is not None else ev, string)
        if self.call_stats is not None:
            self._learn(ev, span, py is not None)
        self.shaper.add(span, call_id=ev.call_id, parent_id=ev.parent_id, pid=ev.pid, tid=ev.tid,
                        now=time.monotonic(), sampled=bool(ev.flags & CallFlags.SAMPLED))

    def _learn(self, ev: CallEvent, span: ReadableSpan, python: bool) -> None:
        """What the statistics need from call records: Python names, communicator sizes, and
        the calls a dead thread left open (the kernel never saw them end)."""
        assert self.call_stats is not None
        a = span.attributes or {}
        if python:
            self.call_stats.learn_python(ev.pid, list(ev.args), str(a.get("code.function.name", span.name)))
        elif "nccl.nranks" in a and ev.flags & CallFlags.OUT and ev.ret == 0:
            self.call_stats.learn_communicator(ev.pid, ev.out_value, int(a["nccl.nranks"]))  # type: ignore[arg-type]
        if ev.flags & CallFlags.INCOMPLETE:
            self.call_stats.incomplete(ev.pid, None if python else self.rows.get(ev.probe_id), span.name)

    def _on_thread_exit(self, rec: ThreadExitEvent) -> None:
        for ev in self.program.pop_frames(rec.pid, rec.tid, rec.depth):
            ev.flags |= CallFlags.INCOMPLETE
            ev.exit_ns = rec.exit_ns
            self.counters.incomplete += 1
            self._on_call(ev, None)

    def _on_exec(self, rec: ExecEvent) -> None:
        """The process is another program now: kernel names resolved in its old image no
        longer hold, and a process the agent knew has its resource and memory map read again
        (while it lives). Without a pid filter every exec on the node arrives: the others wait
        until they make a call or open a watched library."""
        known = self._resources.pop(rec.pid, None) is not None
        self.kernel_names.forget(rec.pid)
        self.symbols.forget(rec.pid)
        if known:
            self._resource_for(rec.pid)

    def _on_lib_open(self, rec: LibOpenEvent) -> None:
        self.counters.library_opens += 1
        pid = rec.pid
        self._resource_for(pid)
        # Read its map now, while it lives (stopped, if gated): what it mapped before this
        # library holds the host stubs of the launches to come (the library itself is mapped
        # after the open, and read at the rescans).
        self.symbols.refresh(pid)
        path = rec.path.decode(errors="replace")
        if not path.startswith("/"):
            try:
                path = os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
            except OSError:
                pass
        family = family_of(path)
        if family is not None:
            lib = resolve(pid, os.path.normpath(path), family)
            if lib is not None:
                self.attacher.ensure(lib, pid)
        if rec.gated:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        now = time.monotonic()
        self._pending_scans.extend((now + d, pid) for d in _RESCAN_DELAYS_S)

    # --- discovery ------------------------------------------------------------------------
    def _candidate_pids(self) -> set[int]:
        if not self.filtering:
            return set(all_pids())
        if self.cfg.cgroup:
            for pid in cgroup_pids(Path(self.cfg.cgroup)) - self.program.targets():
                self.program.add_target(pid)
        return self.program.targets()

    def _scan(self, pids: set[int]) -> None:
        me = os.getpid()
        for pid in pids:
            if pid == me:
                continue
            libs = libraries_of(pid)
            if libs:
                self._resource_for(pid)
            for lib in libs:
                self.attacher.ensure(lib, pid)

    def _prune(self) -> None:
        for pid in [p for p in self._resources if not os.path.exists(f"/proc/{p}")]:
            del self._resources[pid]
            self.kernel_names.forget(pid)
            self.symbols.forget(pid)
            if self.call_stats is not None:  # after its last counts were exported
                self._stats_forget.append((time.monotonic() + 2 * self.cfg.metrics_interval_s, pid))

    # --- lifecycle ------------------------------------------------------------------------
    def _read_call_stats(self, now: float) -> None:
        """Fold the kernel's call statistics into the metric snapshot (half a metric interval
        old at most), and free the entries of processes gone for two intervals."""
        assert self.call_stats is not None
        gone = {pid for t, pid in self._stats_forget if t <= now}
        entries = self.program.call_stats()
        scale = self.guardrail.observe(entries, now) if self.guardrail is not None else None
        self.call_stats.update(entries, scale)
        if gone:
            self._stats_forget = [(t, pid) for t, pid in self._stats_forget if pid not in gone]
            for pid in gone:
                self.call_stats.forget(pid)
            self.program.forget_stats(gone)

    def _launch(self) -> None:
        # The child waits on a pipe until its pid is a target, so its very first call is traced.
        # It first says it runs: Popen returns once the exec has begun, and until the kernel
        # has set up the new image /proc/PID/environ reads empty (the resource would then lack
        # the command's OTEL_SERVICE_NAME for good) and /proc/PID/maps lacks the interpreter.
        r, w = os.pipe()
        running_r, running_w = os.pipe()
        waiter = (f"import os, sys; os.close({running_w}); os.read({r}, 1); os.close({r}); "
                  f"os.execvp(sys.argv[1], sys.argv[1:])")
        self._child = subprocess.Popen([sys.executable, "-S", "-c", waiter, *self.command],
                                       pass_fds=(r, running_w))
        os.close(r)
        os.close(running_w)
        os.read(running_r, 1)  # end of file once the waiter closed its end, or died
        os.close(running_r)
        self.program.add_target(self._child.pid)
        self._resource_for(self._child.pid)
        # The waiter is a Python interpreter too: its per-process Python probes outlive the exec.
        self._scan({self._child.pid})
        os.write(w, b"go\n")
        os.close(w)
        log.info("launched pid %d: %s", self._child.pid, " ".join(self.command))

    def stop(self, *_args: object) -> None:
        """Ask the loop to finish (signal handler)."""
        self._stop = True

    def _forward(self, signum: int, _frame: object) -> None:
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signum)

    def run(self) -> int:
        """Capture until stopped; returns the exit status (the command's, when launched)."""
        for pid in self.cfg.pids:
            if not os.path.exists(f"/proc/{pid}"):
                log.warning("pid %d does not exist (yet); it will be traced if it appears", pid)
            self.program.add_target(pid)
        if self.command:
            signal.signal(signal.SIGINT, self._forward)
            signal.signal(signal.SIGTERM, self._forward)
        else:
            signal.signal(signal.SIGINT, self.stop)
            signal.signal(signal.SIGTERM, self.stop)
        self._scan(self._candidate_pids())
        log.info("ready: %d probes on %d files, layers %s, launches at %s; %s", self.program.probe_count,
                 len(self.attacher.files), ",".join(self.cfg.layers), self.cfg.launch_layer,
                 "targets " + (",".join(map(str, self.cfg.pids)) or self.cfg.cgroup or "command") if self.filtering else "all processes")
        if self.command:
            self._launch()
        next_scan = next_log = next_stats = time.monotonic()
        while not self._stop:
            self.program.poll(10 if self.guardrail is not None and self.guardrail.exits_pending else 100)
            now = time.monotonic()
            self.shaper.tick(now)
            period_done = self.guardrail.tick(now) if self.guardrail is not None else False
            due = {pid for t, pid in self._pending_scans if t <= now}
            if due:
                self._pending_scans = [(t, pid) for t, pid in self._pending_scans if t > now]
                self._scan(due)
                for pid in due:  # it opened a library: read its map while it lives
                    self.symbols.refresh(pid)
            if now >= next_scan:
                next_scan = now + self.cfg.scan_interval_s
                self._scan(self._candidate_pids())
                self._prune()
            cycling = self.guardrail is not None and self.guardrail.cycling
            if self.call_stats is not None and (period_done if cycling else now >= next_stats):
                next_stats = now + self._stats_every
                self._read_call_stats(now)
            if self.cfg.stats_log_interval_s and now >= next_log:
                next_log = now + self.cfg.stats_log_interval_s
                log.info("stats: %s", self.summary())
            if self._child is not None and self._child.poll() is not None:
                break
        return self._finish()

    def _finish(self) -> int:
        # Drain what the kernel still holds (the child's last calls, its thread exits).
        for _ in range(3):
            while self.program.poll(50) >= POLL_BATCH:
                pass
        self.shaper.flush()
        if self.call_stats is not None:
            self._read_call_stats(time.monotonic())
        self.queue.close(timeout_s=max(30.0, self.cfg.export_timeout_s * 2))
        self._meters.shutdown()  # a last collection reads the host sources, so they close after it
        self.host_metrics.close()
        log.info("done: %s", self.summary())
        self.program.close()
        self.symbols.close()
        if self._child is None:
            return 0
        code = self._child.returncode
        return 128 - code if code < 0 else code
