"""What the agent reads from traced processes: documented call arguments only.

Statically, every read of user memory in bpf/ is one of a documented list (docs/reliability.md,
"What the agent reads"). Dynamically, a process passes buffers full of a canary to memcpy, NCCL
and launch calls, and carries it in an environment variable and its command line: no span or
resource attribute may contain it. Command lines and environments are opt-in resource attributes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_run import agent_cmd
from calls_workload import libraries
from otel_eacgm.config import ConfigError, load
from otel_eacgm.resources import process_resource

REPO = Path(__file__).resolve().parents[2]
CANARY = "EACGM-CANARY-7f3a9c"

# Each user-memory read in bpf/, by the destination it fills, and what it is.
DOCUMENTED_READS = {
    "&args[6]": "call arguments 7-10, passed on the stack (the x86-64 ABI's slots after the return address)",
    "sev->str": "one string argument of the catalog row (kernel/function name), bounded by the event's buffer",
    "f.deref": "one struct an argument points to (CUlaunchConfig of cuLaunchKernelEx), fixed size",
    "&out_value": "the out-parameter handle a call returns (CUfunction, ncclComm_t), 8 bytes",
    "s->func": "Python USDT: the function name",
    "s->file": "Python USDT: the file name",
    "ev->func": "Python USDT: the function name",
    "ev->file": "Python USDT: the file name",
    "p->path": "openat: the file name, to spot watched libraries",
    "&v": "Python frame walk: one pointer of the interpreter's state chain, 8 bytes",
    "buf->b": "Python frame walk: one interpreter frame (code object, previous frame, instruction), bounded buffer",
    "&first": "Python frame walk: a code object's first line number, 4 bytes",
}
# bpf_probe_read (the old either-memory helper) and bpf_copy_from_user read user memory too.
_READ = re.compile(r"\b(?:bpf_probe_read(?:_user)?(?:_str)?|bpf_copy_from_user)\s*\(\s*([^,]+?)\s*,")


def _bpf_sources() -> list[Path]:
    """Every C file and header under bpf/, at any depth (calls.bpf.c keeps its code in calls/*.h)."""
    return sorted(p for p in (REPO / "bpf").rglob("*") if p.suffix in (".c", ".h"))


def test_every_user_memory_read_in_bpf_is_documented() -> None:
    found = {}
    for src in _bpf_sources():
        text = src.read_text()
        for m in _READ.finditer(text):
            found[m.group(1)] = f"{src.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}"
    assert found, "no bpf_probe_read_user call found: the pattern is stale"
    # A scan that misses a file must not pass: every documented read is still somewhere in bpf/.
    missing = set(DOCUMENTED_READS) - set(found)
    assert not missing, (f"documented user-memory reads {sorted(missing)} not found in {len(_bpf_sources())} files "
                         "under bpf/: a file was not scanned, or the read is gone (then drop it from "
                         "DOCUMENTED_READS and docs/reliability.md)")
    undocumented = {dst: where for dst, where in found.items() if dst not in DOCUMENTED_READS}
    assert not undocumented, (f"user-memory reads not in the documented list {undocumented}: add them to "
                              "DOCUMENTED_READS and to docs/reliability.md, saying what is read and how much")
    doc = (REPO / "docs/reliability.md").read_text()
    for dst in found:
        assert f"`{dst}`" in doc, f"docs/reliability.md does not list the read into `{dst}`"


_WORKLOAD = f"""
import ctypes, sys
rt, nccl = ctypes.CDLL(sys.argv[1]), ctypes.CDLL(sys.argv[2])
secret = (sys.argv[3].encode() * 64)[:1024]
buf = ctypes.create_string_buffer(secret, 1024)
dst = ctypes.create_string_buffer(1024)
vp, sz = ctypes.c_void_p, ctypes.c_size_t
rt.cudaMemcpy(dst, buf, sz(1024), ctypes.c_int(1))
rt.cudaMemcpyAsync(dst, buf, sz(1024), ctypes.c_int(1), vp(0))
rt.cudaMemset(buf, ctypes.c_int(0x41), sz(16))
nccl.ncclAllReduce(buf, dst, sz(1024), ctypes.c_int(0), ctypes.c_int(0), None, None)
params = (vp * 2)(ctypes.cast(buf, vp), ctypes.cast(buf, vp))
# the canary buffer as the kernel stub and as the kernel's parameters
rt.cudaLaunchKernel(ctypes.cast(buf, vp), ctypes.c_uint64(1 | (1 << 32)), ctypes.c_uint32(1),
                    ctypes.c_uint64(32 | (1 << 32)), ctypes.c_uint32(1), params, sz(0), vp(0))
print("done", flush=True)
"""


@pytest.mark.ebpf
def test_no_buffer_content_environment_or_command_line_is_exported(pipeline) -> None:  # noqa: ANN001
    cudart, nccl = libraries()
    cmd = agent_cmd(pipeline.grpc_endpoint, "--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl",
                    "--", sys.executable, "-c", _WORKLOAD, cudart, nccl, CANARY)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, EACGM_SECRET=CANARY, OTEL_EACGM_SPAN_SAMPLE_RATIO="1"))
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-3000:]
    pid = int(re.search(r"launched pid (\d+)", proc.stderr).group(1))
    names = {"cudaMemcpy", "cudaMemcpyAsync", "cudaMemset", "ncclAllReduce", "cudaLaunchKernel"}
    assert pipeline.store.wait_for(
        lambda: names <= {s["name"] for s in pipeline.store.spans() if s["resource"].get("process.pid") == pid}, 30)
    spans = [s for s in pipeline.store.spans() if s["resource"].get("process.pid") == pid]
    text = repr(spans)
    for needle in (CANARY, CANARY.encode().hex(), CANARY[:8]):
        assert needle not in text, f"{needle!r} found in exported spans"
    resource = spans[0]["resource"]
    assert not [k for k in resource if k.startswith(("process.command", "process.environment"))], resource
    assert CANARY not in repr([p for p in pipeline.store.metric_points() if p["resource"].get("process.pid") == pid])


def test_command_line_and_environment_are_opt_in(tmp_path: Path) -> None:
    code = "import time; print('ready', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code, CANARY], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, EACGM_SECRET=CANARY, SLURM_JOB_ID="42"))
    try:
        # Read once it runs: while its exec is under way /proc/PID/{cmdline,environ} read empty.
        assert child.stdout.readline().strip() == "ready"
        default = dict(process_resource(child.pid).attributes)
        assert CANARY not in repr(default)
        opted = dict(process_resource(child.pid, command_line=True, environment=["SLURM_JOB_ID", "ABSENT"]).attributes)
        assert opted["process.command_args"] == (sys.executable, "-c", code, CANARY)
        assert opted["process.environment_variable.SLURM_JOB_ID"] == "42"
        assert "process.environment_variable.ABSENT" not in opted
        assert "process.environment_variable.EACGM_SECRET" not in opted  # only the names asked for
    finally:
        child.kill()
        child.wait()
    cfg = load(None, environ={})
    assert cfg.resource_command_line is False and cfg.resource_environment == []
    cfg = load(None, environ={"OTEL_EACGM_RESOURCE_ENVIRONMENT": "SLURM_JOB_ID,RUN_ID",
                              "OTEL_EACGM_RESOURCE_COMMAND_LINE": "true"})
    assert cfg.resource_environment == ["SLURM_JOB_ID", "RUN_ID"] and cfg.resource_command_line
    with pytest.raises(ConfigError, match="resource_environment"):
        load(None, environ={"OTEL_EACGM_RESOURCE_ENVIRONMENT": "BAD=NAME"})
