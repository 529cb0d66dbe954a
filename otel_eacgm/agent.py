"""The agent's run loop: poll the ring buffer, run the periodic tasks, drain and exit cleanly.

One thread polls the BPF ring buffer; each record goes down the record pipeline (pipeline.py)
to the export queue, whose own thread ships spans (export.SpanQueue). Between polls the loop
runs its periodic tasks: trace shaping timeouts, the guardrail and call statistics, rescans
after library opens, the full discovery scan and the stats log line. wiring.build_agent puts
the parts together from the configuration.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable

from opentelemetry.sdk.metrics import MeterProvider

from otel_eacgm import hold_guard
from otel_eacgm.bpf_program import POLL_BATCH, CallProgram
from otel_eacgm.call_stats_reader import CallStatsReader
from otel_eacgm.discovery import Discovery
from otel_eacgm.export import SpanQueue
from otel_eacgm.launcher import Launcher
from otel_eacgm.metrics.host import HostMetrics
from otel_eacgm.pause_cycle import PauseCycle
from otel_eacgm.pyframes.frame_spans import FrameSpans
from otel_eacgm.probe_links import ProbeLinks
from otel_eacgm.shaping import TraceShaper
from otel_eacgm.telemetry import AgentTelemetry

log = logging.getLogger(__name__)

Task = Callable[[float], None]
"""A periodic task of the loop: called with time.monotonic() after every poll."""


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


def every(interval_s: float, task: Task) -> Task:
    """`task`, run at the first tick and then at most once per `interval_s`."""
    due = float("-inf")

    def tick(now: float) -> None:
        nonlocal due
        if now >= due:
            due = now + interval_s
            task(now)

    return tick


@dataclasses.dataclass
class Agent:
    """Runs until stopped (or until the launched command exits). Built by wiring.build_agent."""

    program: CallProgram
    links: ProbeLinks
    discovery: Discovery
    shaper: TraceShaper
    queue: SpanQueue
    meters: MeterProvider
    host_metrics: HostMetrics
    telemetry: AgentTelemetry
    call_stats: CallStatsReader | None
    launcher: Launcher | None
    pids: list[int]
    ready_line: str
    scan_interval_s: float
    stats_log_interval_s: float
    export_timeout_s: float
    pause: PauseCycle | None = None
    frames: FrameSpans | None = None
    frames_idle_s: float = 10.0
    _stop: bool = False
    _hold_guard: subprocess.Popen | None = None  # kept, not read: it outlives the agent on purpose

    def stop(self, *_args: object) -> None:
        """Ask the loop to finish (signal handler)."""
        self._stop = True

    def tasks(self) -> list[Task]:
        """The loop's periodic tasks, in the order they run after each poll."""
        tasks: list[Task] = [self.shaper.tick]
        if self.frames is not None:
            frames, idle_ns = self.frames, int(self.frames_idle_s * 1e9)
            tasks.insert(0, every(1.0, lambda _now: frames.tick(time.monotonic_ns(), idle_ns)))
        if self.pause is not None:
            tasks.append(self.pause.tick)
        if self.call_stats is not None:
            tasks.append(self.call_stats.tick)
        tasks += [self.discovery.rescan_due, every(self.scan_interval_s, self.discovery.scan_all)]
        if self.stats_log_interval_s:
            tasks.append(every(self.stats_log_interval_s, lambda _now: log.info("stats: %s", self.telemetry.summary())))
        return tasks

    def run(self) -> int:
        """Capture until stopped; returns the exit status (the command's, when launched)."""
        if self.program.options.holds:  # before any target: from then on the kernel may stop processes
            self._hold_guard = hold_guard.start(self.program.held_map_fd)
        for pid in self.pids:
            self.program.add_target(pid)
            if not os.path.exists(f"/proc/{pid}"):  # exited before it was a target: its exit removed nothing
                self.program.remove_target(pid)
                log.warning("pid %d exited before it was traced", pid)
        if self.launcher is not None:
            self.launcher.install_signal_handlers()
        else:
            signal.signal(signal.SIGINT, self.stop)
            signal.signal(signal.SIGTERM, self.stop)
        self.discovery.start()
        log.info("ready: %d probes on %d files, %s", self.links.probe_count, len(self.discovery.attacher.files),
                 self.ready_line)
        if self.launcher is not None:
            self.launcher.start(self._trace_launched)
        tasks = self.tasks()
        # What start-up made (BCC, the SDK, the catalog, symbol tables) lives as long as the agent:
        # kept out of the collector's full passes, which the spans' short lives would otherwise
        # trigger over and over (about a tenth of the agent's CPU at 100 % spans).
        gc.freeze()
        gc.set_threshold(10_000, 10, 10)  # and the youngest pass runs once per 10,000 new objects, not 700
        while not self._stop:
            self.program.poll(self.call_stats.poll_timeout_ms if self.call_stats is not None else 100)
            now = time.monotonic()
            for task in tasks:
                task(now)
            if self.launcher is not None and self.launcher.exited():
                break
        return self._finish()

    def discard(self) -> None:
        """Release what build_agent made, for an agent stopped before run(): nothing was
        attached, captured or launched, so there is nothing to drain or export."""
        self.queue.close(timeout_s=1.0)
        self.meters.shutdown()
        self.host_metrics.close()
        self._release_kernel_side()

    def _release_kernel_side(self) -> None:
        """The pause cycle's log, the probes, the BPF program and the symbol caches: last."""
        if self.pause is not None:
            self.pause.close()
        self.links.release()
        self.program.close()
        self.discovery.symbols.close()

    def _trace_launched(self, pid: int) -> None:
        self.program.add_target(pid)
        self.discovery.resource_for(pid)
        # The waiter is a Python interpreter too: its per-process Python probes outlive the exec.
        self.discovery.scan({pid})

    def _finish(self) -> int:
        # No process is stopped for the agent from now on; those already stopped are in the
        # ring buffer, and the drain below lets them go.
        self.program.stop_holding()
        # Drain what the kernel still holds (the child's last calls, its thread exits).
        for _ in range(3):
            while self.program.poll(50) >= POLL_BATCH:
                pass
        if self.frames is not None:
            self.frames.flush()
            log.info("python frames: %s", self.frames.counters)
        self.shaper.flush()
        if self.call_stats is not None:
            self.call_stats.read(time.monotonic())
        self.queue.close(timeout_s=max(30.0, self.export_timeout_s * 2))
        self.meters.shutdown()  # a last collection reads the host sources, so they close after it
        self.host_metrics.close()
        log.info("done: %s", self.telemetry.summary())
        self._release_kernel_side()
        return self.launcher.exit_status() if self.launcher is not None else 0
