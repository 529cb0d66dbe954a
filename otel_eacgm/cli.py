"""`otel-eacgm` command line: agent, doctor, detector."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Sequence

from otel_eacgm import __version__
from otel_eacgm.config import ConfigError, load


def _agent_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="trace CUDA/NCCL calls with eBPF and export OTLP spans",
                       description="Trace processes with eBPF uprobes; `agent -- CMD ARGS` launches CMD, "
                                   "traces it and exits with its status once everything is exported. "
                                   "Every flag overrides the config file and OTEL_EACGM_<KEY>; the defaults "
                                   "shown are the settings' own (docs/configuration.md).",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common_flags(p)
    p.add_argument("--perfetto", help=_setting_help("perfetto"))


def _trace_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="trace one command into a Chrome/Perfetto file (no backend needed)",
                       description="`trace --perfetto out.json -- python train.py`: launch the command, trace it "
                                   "and write a timeline for ui.perfetto.dev or chrome://tracing. Spans are exported "
                                   "whole (span_sample_ratio 1.0 unless --sample-ratio says otherwise); OTLP export "
                                   "only with --endpoint.")
    _common_flags(p, sample_ratio_default="1.0 in `trace`: every span")
    p.add_argument("--perfetto", required=True, help="the trace file to write (JSON) (required)")


def _setting_help(key: str, default: object = None) -> str:
    """A flag's help: the setting's own docstring and its default (AgentConfig)."""
    from otel_eacgm.config import AgentConfig  # noqa: PLC0415 - keeps `--version` light
    from otel_eacgm.settings import field_docs  # noqa: PLC0415

    field = {f.name: f for f in dataclasses.fields(AgentConfig)}[key]
    if default is None:
        default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    if isinstance(default, list):
        default = ",".join(map(str, default)) or "none"
    elif default is None:
        default = "none"
    doc = " ".join(field_docs(AgentConfig).get(key, "").split()).replace("%", "%%")
    return f"{doc} (default: {default}; setting {key})"


def _common_flags(p: argparse.ArgumentParser, sample_ratio_default: str | None = None) -> None:
    p.add_argument("--config", help="YAML config file, every option at its default: examples/agent.yaml "
                                    "(default: none; environment OTEL_EACGM_<KEY> and these flags override it)")
    p.add_argument("--endpoint", help=_setting_help("endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT, else the SDK's "
                                                    "http://localhost:4317 (grpc) / http://localhost:4318 (http)"))
    p.add_argument("--protocol", choices=["grpc", "http/protobuf"],
                   help=_setting_help("protocol", "OTEL_EXPORTER_OTLP_PROTOCOL, else grpc"))
    p.add_argument("--insecure", action="store_const", const=True,
                   help=_setting_help("insecure", "OTEL_EXPORTER_OTLP_INSECURE, else plaintext for an http:// "
                                                  "endpoint and TLS for https:// or host:port"))
    p.add_argument("--pid", dest="pids", action="append", type=int,
                   help="trace this process and its children; repeatable (default: every process, or the command)")
    p.add_argument("--cgroup", help=_setting_help("cgroup", "none"))
    p.add_argument("--layers", help=_setting_help("layers"))
    p.add_argument("--launch-layer", dest="launch_layer", choices=["cuda.driver", "cuda.runtime"],
                   help=_setting_help("launch_layer"))
    p.add_argument("--sample-ratio", dest="span_sample_ratio", type=float, metavar="RATIO",
                   help=_setting_help("span_sample_ratio", sample_ratio_default))
    p.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error", "critical"],
                   type=str.lower, help=_setting_help("log_level"))
    p.add_argument("--dump-bpf", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...] to launch and trace (default: none)")


def check_pids(pids: Sequence[int], proc: str = "/proc") -> None:
    """Refuse a --pid that names no process: waiting for it would trace whichever process
    later takes that pid number."""
    for pid in pids:
        if not os.path.exists(f"{proc}/{pid}"):
            raise ProcessLookupError(f"--pid {pid}: no such process (a pid must exist when the agent starts)")


def _run_agent(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    flags = {k: getattr(args, k) for k in ("endpoint", "protocol", "insecure", "pids", "cgroup", "layers",
                                          "launch_layer", "span_sample_ratio", "log_level", "perfetto")}
    if args.cmd == "trace":
        if not command:
            print("otel-eacgm trace: give the command to trace after --", file=sys.stderr)
            return 2
        flags["otlp"] = bool(args.endpoint)
        if flags["span_sample_ratio"] is None:
            flags["span_sample_ratio"] = 1.0
    try:
        cfg = load(args.config, flags)
    except ConfigError as exc:
        print(f"otel-eacgm {args.cmd}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s otel-eacgm %(levelname)s %(name)s: %(message)s")
    from otel_eacgm.launcher import CommandNotRunnable, check_runnable

    try:
        if command:
            check_runnable(command)
        check_pids(cfg.pids)
    except CommandNotRunnable as exc:
        print(f"otel-eacgm {args.cmd}: {exc}", file=sys.stderr)
        return exc.status
    except ProcessLookupError as exc:
        print(f"otel-eacgm {args.cmd}: {exc}", file=sys.stderr)
        return 1
    from otel_eacgm.doctor import check_privileges

    privileges = check_privileges()
    if not privileges.ok:
        print(f"otel-eacgm agent: cannot trace as {privileges.detail}; {privileges.fix}. "
              "`otel-eacgm doctor` checks everything tracing needs.", file=sys.stderr)
        return 1
    from otel_eacgm.bpf_program import BpfError
    from otel_eacgm.wiring import build_agent

    interrupt = StartInterrupt()
    signal.signal(signal.SIGINT, interrupt.handle)
    try:
        agent = build_agent(cfg, command, dump_bpf=args.dump_bpf)
    except (BpfError, OSError, ValueError) as exc:  # OSError: a file named in the config (pause_cycle_log)
        print(f"otel-eacgm agent: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C while BCC compiles: no probe is attached before run()
        print(INTERRUPTED, file=sys.stderr)
        return 130
    interrupt.building = False
    if interrupt.received:  # the KeyboardInterrupt was swallowed on its way up (see StartInterrupt)
        agent.discard()
        print(INTERRUPTED, file=sys.stderr)
        return 130
    return agent.run()


INTERRUPTED = "otel-eacgm agent: interrupted while starting; nothing was traced"


class StartInterrupt:
    """Ctrl-C while the agent starts (BCC compiles for seconds).

    Python's own handler raises KeyboardInterrupt wherever the interpreter happens to be, and
    code there may swallow it (BCC's loader has bare `except:` clauses; an exception raised in a
    finalizer is only printed), and the agent would then start and run on as if no Ctrl-C had
    come. This handler raises too (so a compile is cut short where it can be) and also
    remembers the signal, which the caller checks once start-up returns. After start-up it only
    remembers: Agent.run installs its own handlers next.
    """

    def __init__(self) -> None:
        self.received = False
        self.building = True

    def handle(self, _signum: int, _frame: object) -> None:
        self.received = True
        if self.building:
            raise KeyboardInterrupt


def parser() -> argparse.ArgumentParser:
    """The command line of `otel-eacgm` (the detector's is eacgm_detector.cli's)."""
    top = argparse.ArgumentParser(prog="otel-eacgm", description=__doc__)
    top.add_argument("--version", action="version", version=f"otel-eacgm {__version__}")
    sub = top.add_subparsers(dest="cmd", required=True)
    _agent_parser(sub)
    _trace_parser(sub)
    d = sub.add_parser("doctor", help="check that this machine can trace, with a fix for each problem")
    d.add_argument("--json", action="store_true", help="machine-readable output (default: one line per check)")
    d.add_argument("--endpoint", help="also check this OTLP endpoint with a real export, and name the fix when it "
                                      "fails (default: none, the endpoint is not checked)")
    d.add_argument("--protocol", choices=["grpc", "http/protobuf"], help=_setting_help(
        "protocol", "OTEL_EXPORTER_OTLP_PROTOCOL, else grpc"))
    d.add_argument("--insecure", action="store_const", const=True, help=_setting_help(
        "insecure", "OTEL_EXPORTER_OTLP_INSECURE, else plaintext for an http:// endpoint and TLS for https:// "
                    "or host:port"))
    sub.add_parser("detector", help="the anomaly detector (run `otel-eacgm detector --help`)", add_help=False)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `otel-eacgm` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "detector":
        from eacgm_detector.cli import main as detector_main

        return detector_main(argv[1:])
    args = parser().parse_args(argv)
    if args.cmd in ("agent", "trace"):
        return _run_agent(args)
    from otel_eacgm.doctor import check_endpoint, run_doctor

    endpoint = None
    if args.endpoint:
        try:
            cfg = load(None, {"endpoint": args.endpoint, "protocol": args.protocol, "insecure": args.insecure})
        except ConfigError as exc:
            print(f"otel-eacgm doctor: {exc}", file=sys.stderr)
            return 2
        endpoint = check_endpoint(cfg.protocol, cfg.endpoint, cfg.insecure)
    return run_doctor(as_json=args.json, endpoint=endpoint)


if __name__ == "__main__":
    sys.exit(main())
