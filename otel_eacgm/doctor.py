"""`otel-eacgm doctor`: can this machine trace? One line per check, each with a fix hint.

Exit status 1 when a check that tracing needs fails (root/capabilities, BPF, tracefs, kernel
headers, BCC, a real uprobe); NVML and the list of mapped libraries are informational.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import platform
import sys
from collections import Counter
from pathlib import Path

from otel_eacgm import bpf_program
from otel_eacgm.bpf_program import BpfError
from otel_eacgm.probes.libraries import all_pids, family_of

_CAP_SYS_ADMIN, _CAP_PERFMON, _CAP_BPF = 21, 38, 39
_SYS_BPF = 321  # x86-64
_BPF_MAP_CREATE = 0
_BPF_MAP_TYPE_ARRAY = 2


@dataclasses.dataclass
class Check:
    """One doctor line."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_privileges() -> Check:
    caps = _caps()
    has = lambda bit: bool(caps >> bit & 1)  # noqa: E731
    ok = has(_CAP_SYS_ADMIN) or (has(_CAP_BPF) and has(_CAP_PERFMON))
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    detail = f"{who}, CAP_BPF={has(_CAP_BPF)} CAP_PERFMON={has(_CAP_PERFMON)} CAP_SYS_ADMIN={has(_CAP_SYS_ADMIN)}"
    return Check("privileges", ok, detail, "run as root, or grant CAP_BPF,CAP_PERFMON,CAP_SYS_RESOURCE (see systemd unit)")


def check_bpf_syscall() -> Check:
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 30)(_BPF_MAP_TYPE_ARRAY, 4, 8, 1)
    fd = libc.syscall(_SYS_BPF, _BPF_MAP_CREATE, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
        return Check("bpf syscall", True, "bpf(BPF_MAP_CREATE) works")
    err = ctypes.get_errno()
    return Check("bpf syscall", False, f"bpf(BPF_MAP_CREATE) failed: {os.strerror(err)}",
                 "needs privileges; check kernel.unprivileged_bpf_disabled and CONFIG_BPF_SYSCALL")


def check_tracefs() -> Check:
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        try:
            if Path(root, "uprobe_events").exists():
                return Check("tracefs", True, f"{root} (uprobe_events present)")
        except PermissionError:
            return Check("tracefs", False, f"{root} is not readable by uid {os.geteuid()}",
                         "run as root (tracefs is root-only)")
    return Check("tracefs", False, "no uprobe_events under /sys/kernel/tracing",
                 "mount -t tracefs tracefs /sys/kernel/tracing; the kernel needs CONFIG_UPROBE_EVENTS")


def check_btf() -> Check:
    ok = Path("/sys/kernel/btf/vmlinux").exists()
    return Check("btf", ok, "/sys/kernel/btf/vmlinux" + (" present" if ok else " missing"),
                 "a kernel with CONFIG_DEBUG_INFO_BTF=y (BCC does not need it; libbpf tools do)", required=False)


def check_headers() -> Check:
    release = platform.release()
    build = Path("/lib/modules", release, "build")
    if (build / "include/generated/autoconf.h").exists():
        target = os.path.realpath(build)
        note = "" if release in target else f" (linked to {target}: not the running kernel's, fine for uprobes)"
        return Check("kernel headers", True, f"{build}{note}")
    return Check("kernel headers", False, f"{build} has no usable headers",
                 "apt-get install linux-headers-amd64, then scripts/link-kernel-headers.sh")


def check_bcc() -> Check:
    try:
        where = bpf_program.bcc_location()
    except BpfError as exc:
        return Check("bcc", False, str(exc),
                     "apt-get install python3-bpfcc; use the .venv built by `make setup` (--system-site-packages)")
    return Check("bcc", True, f"bcc from {where}")


def check_uprobe() -> Check:
    """The real test: compile a BPF program and attach a uprobe to libc."""
    try:
        bpf_program.try_libc_uprobe()
    except BpfError as exc:
        return Check("uprobe", False, str(exc), "see the checks above (headers, privileges, tracefs)")
    return Check("uprobe", True, "compiled a BPF program and attached a uprobe to libc getpid")


def check_probe_links() -> Check:
    """uprobe_multi links (kernel 6.6+): probes attached and released in one step per library,
    and PyTorch operator probes cyclable by the overhead guardrail."""
    try:
        ok = bpf_program.uprobe_multi_usable()
    except BpfError as exc:
        ok, why = False, str(exc)
    else:
        why = "uprobe_multi links work" if ok else f"kernel {platform.release()} has no uprobe_multi links (6.6+)"
    return Check("probe links", ok, why, "without them each probe is a perf event: slow to release, and the "
                 "guardrail cycles launch probes only", required=False)


def check_nvml() -> Check:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError or missing library
        return Check("nvml", False, f"NVML unavailable ({exc}); GPU metrics are off",
                     "install the NVIDIA driver on GPU nodes", required=False)
    return Check("nvml", True, f"{count} GPU(s), driver {driver}", required=False)


def _python_has_usdt(exe: str) -> bool:
    from otel_eacgm.probes.python_usdt import has_probes

    return has_probes(exe)


def _frames_note(path: str) -> tuple[bool, str] | None:
    """Whether the Python frame walk reads the interpreter file `path`; None: no interpreter there."""
    from otel_eacgm.pyframes.layouts import UnknownInterpreter, frame_support  # noqa: PLC0415

    try:
        note = frame_support(path)
    except UnknownInterpreter as exc:  # its message names the file, which the check line names already
        return False, str(exc).removeprefix(f"{path}: ")
    return None if note is None else (True, note)


def check_python_frames() -> Check:
    """Whether the agent's own interpreter (usually the traced programs' too) has its frames read."""
    exe = os.path.realpath(sys.executable)
    candidates = [exe, *(str(p) for p in Path(exe).parent.parent.glob("lib/libpython3*.so.1.0"))]
    found = next((n for n in map(_frames_note, candidates) if n is not None), None)
    ok, detail = found if found is not None else (False, "no CPython runtime (_PyRuntime) in it or its libpython")
    return Check("python frames", ok, f"{exe}: {detail}",
                 "Python spans come from frames of CPython 3.10-3.14 (3.13+ through _Py_DebugOffsets); other "
                 "interpreters get none, the other layers are traced", required=False)


def check_python() -> Check:
    """The agent's own interpreter, usually the one the traced programs use too."""
    from otel_eacgm.probes.python_usdt import FIRES, interpreter_note

    exe = os.path.realpath(sys.executable)
    note = interpreter_note(exe)
    return Check("python usdt", note == FIRES, f"{exe}: {note}",
                 "trace Python functions with an interpreter whose function probes fire (3.10 and older built "
                 "--with-dtrace, or 3.15+); the torch and CUDA layers work without them", required=False)


def check_libraries() -> list[Check]:
    """Which CUDA/NCCL/PyTorch/Python libraries running processes map."""
    families: Counter[str] = Counter()
    torch = pythons = 0
    usdt: dict[str, bool] = {}
    frames: dict[str, tuple[bool, str] | None] = {}
    for pid in all_pids():
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        seen = set()
        for line in maps.splitlines():
            path = line.split(None, 5)[-1] if line.count(" ") >= 5 else ""
            fam = family_of(path) if path.startswith("/") else None
            if fam:
                seen.add(fam.value)
                if fam.value == "python" and path not in frames:
                    frames[path] = _frames_note(path)
            if "libtorch_cpu" in path:
                seen.add("torch")
        families.update(seen - {"torch"})
        torch += "torch" in seen
        if os.path.basename(exe).startswith("python"):
            pythons += 1
            usdt.setdefault(exe, _python_has_usdt(exe))
    lines = [Check("mapped libraries", True,
                   ", ".join(f"{k}: {families.get(k, 0)} processes" for k in ("cudart", "cuda", "nccl"))
                   + f", torch: {torch} processes", required=False)]
    known = {path: note for path, note in frames.items() if note is not None}
    if known:
        lines.append(Check("python frames of processes", all(ok for ok, _ in known.values()),
                           "; ".join(f"{path}: {note}" for path, (_, note) in sorted(known.items())),
                           "processes of these interpreters get no Python spans; their other layers are traced",
                           required=False))
    if usdt:
        detail = "; ".join(f"{exe}: {'USDT function probes' if has else 'no USDT function probes'}"
                           for exe, has in sorted(usdt.items()))
        lines.append(Check("python interpreters", all(usdt.values()), f"{pythons} processes; {detail}",
                           "Python function spans need an interpreter built --with-dtrace (e.g. Debian's /usr/bin/python3.11)",
                           required=False))
    return lines


def _safe(check) -> Check:  # noqa: ANN001
    """Run one check; an unexpected OS error becomes a failed line, not a crash."""
    try:
        return check()
    except OSError as exc:
        return Check(check.__name__.removeprefix("check_").replace("_", " "), False, f"could not check: {exc}")


def run_checks() -> list[Check]:
    """Every check, in order."""
    checks = [_safe(c) for c in (check_privileges, check_bpf_syscall, check_tracefs, check_btf, check_headers,
                                 check_bcc)]
    if all(c.ok for c in checks if c.required):
        checks.append(check_uprobe())
        checks.append(check_probe_links())
    checks.append(check_nvml())
    checks.append(_safe(check_python_frames))
    checks.append(_safe(check_python))
    checks.extend(check_libraries())
    return checks


def check_endpoint(protocol: str, endpoint: str | None, insecure: bool | None, timeout_s: float = 5.0) -> Check:
    """A real OTLP export (an empty span batch) to the endpoint as the agent would send it;
    when it fails, what listens there and the fix (endpoint_check)."""
    from opentelemetry.sdk.trace.export import SpanExportResult  # noqa: PLC0415

    from otel_eacgm.endpoint_check import advice, probe, resolve  # noqa: PLC0415
    from otel_eacgm.export import span_exporter  # noqa: PLC0415

    target = resolve(protocol, endpoint, insecure)
    how = f"{target.endpoint} ({protocol}, {'TLS' if target.tls else 'plaintext'})"
    exporter = span_exporter(protocol, endpoint, insecure, timeout_s)
    try:
        result = exporter.export([])
    except Exception as exc:  # noqa: BLE001 - the exporter's own failure is the finding
        result, how = SpanExportResult.FAILURE, f"{how}: {exc}"
    finally:
        exporter.shutdown()
    if result is SpanExportResult.SUCCESS:
        return Check("endpoint", True, f"an OTLP export to {how} was accepted")
    fix = advice(target, probe(target.host, target.port)) or "the endpoint answers but refused the export: see its log"
    return Check("endpoint", False, f"an OTLP export to {how} failed", fix)


def run_doctor(as_json: bool = False, endpoint: Check | None = None) -> int:
    """Print the report (with `endpoint`, the result of check_endpoint, when asked for); 1 when
    tracing cannot work or the endpoint check failed."""
    checks = run_checks() + ([endpoint] if endpoint is not None else [])
    if as_json:
        print(json.dumps([dataclasses.asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
            hint = f"  -> fix: {c.fix}" if not c.ok and c.fix else ""
            print(f"[{mark}] {c.name}: {c.detail}{hint}")
    failed = [c for c in checks if c.required and not c.ok]
    if not as_json:
        print("tracing: " + ("ready" if not failed else f"NOT possible ({', '.join(c.name for c in failed)})"))
    return 1 if failed else 0
