"""Python spans from the interpreter's own frames, on every CPython here, through real uprobes
on libcudart and the real Collector: no USDT, no profile function, nothing in the program.

Each interpreter (pyenv's 3.10, 3.11, 3.12, 3.13 and Debian's 3.11) runs the same small
training loop; the exact tree must come out on each: Trainer.run > step (one per step) >
forward > cudaSetDevice, cudaMemset, and step > cudaDeviceSynchronize. 3.13 reads its layout
from its own _Py_DebugOffsets, the path 3.14 takes. A real PyTorch training loop on 3.10,
Debian's 3.11, 3.12 and 3.13 (each in its torch venv) must give one exact step tree, Python >
aten:: > aten::. Churned code objects and threads, and threads hopping into subinterpreters
that are then destroyed, must never give a wrong name.
"""

from __future__ import annotations

import ast
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_run import REPO, agent_cmd, children, exported_spans

pytestmark = pytest.mark.ebpf

WORKLOAD = str(REPO / "tests/workloads/python_frames.py")
STEPS = 3
PYENV = Path("/root/.pyenv/versions")
INTERPRETERS = {
    "3.10": PYENV / "3.10.13/bin/python3.10",
    "3.11": PYENV / "3.11.7/bin/python3.11",
    "3.11-debian": Path("/usr/bin/python3.11"),
    "3.12": PYENV / "3.12.1/bin/python3.12",
    "3.13": PYENV / "3.13.0/bin/python3.13",
}


def libcudart() -> str:
    import nvidia.cu13  # noqa: PLC0415 - the test venv's wheel, loaded by path by every interpreter

    return str(Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13")


def source_lines() -> dict[str, int]:
    """Lines of the workload: `def NAME` and the `# LINE tag` call sites."""
    text = Path(WORKLOAD).read_text()
    out = {f"def {n.name}": n.lineno for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)}
    for number, line in enumerate(text.splitlines(), 1):
        if "# LINE " in line:
            out[line.split("# LINE ", 1)[1].strip()] = number
    return out


def traced(pipeline, python: Path, *extra: str, env: dict | None = None, frames: bool = True):  # noqa: ANN001, ANN201
    """Run the workload on `python` under the agent; (agent run, workload lines, its spans)."""
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "cuda.runtime", *extra, "--", str(python), WORKLOAD,
                    libcudart(), str(STEPS))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, OTEL_EACGM_GPU_METRICS="0", OTEL_EACGM_SPAN_SAMPLE_RATIO="1",
                                   OTEL_EACGM_PYTHON_FRAMES="1" if frames else "0", **(env or {})))
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    pid = next(line["pid"] for line in lines if "pid" in line)
    return proc, lines, exported_spans(pipeline.store, pid, proc.stderr)



@pytest.mark.parametrize("version", list(INTERPRETERS))
def test_frames_make_the_span_tree_on_every_interpreter(pipeline, version: str) -> None:  # noqa: ANN001
    python = INTERPRETERS[version]
    if not python.exists():
        pytest.skip(f"{python} is not installed")
    proc, lines, spans = traced(pipeline, python)
    minor = version.split("-")[0]
    assert next(line["version"] for line in lines if "version" in line) == [3, int(minor.split(".")[1])]
    source = "debug offsets" if minor == "3.13" else "table"
    assert f"Python {minor} frames are read" in proc.stderr and f"layout from {source}" in proc.stderr
    where = source_lines()
    kids = children(spans)
    py = [s for s in spans if s["attributes"]["eacgm.layer"] == "python"]
    assert collections.Counter(s["name"] for s in py) == {"Trainer.run": 1, "step": STEPS, "forward": STEPS}, \
        proc.stderr[-3000:]
    (run,) = [s for s in py if s["name"] == "Trainer.run"]
    assert run["parent_span_id"] == ""
    steps = kids[run["span_id"]]
    assert [s["name"] for s in steps] == ["step"] * STEPS
    brackets = [(line["start"], line["end"]) for line in lines if "step" in line]
    for step, (t0, t1) in zip(steps, brackets):
        assert [c["name"] for c in kids[step["span_id"]]] == ["forward", "cudaDeviceSynchronize"]
        (forward,) = [c for c in kids[step["span_id"]] if c["name"] == "forward"]
        calls = kids[forward["span_id"]]
        assert [c["name"] for c in calls] == ["cudaSetDevice", "cudaMemset"]
        assert [c["attributes"]["eacgm.python.line"] for c in calls] == [where["forward.set"], where["forward.memset"]]
        sync = kids[step["span_id"]][1]
        assert sync["attributes"]["eacgm.python.line"] == where["step.sync"]
        # a frame's span runs from its first traced call to its last, inside the step's wall clock
        assert forward["start"] == calls[0]["start"] and forward["end"] == calls[-1]["end"]
        assert step["start"] == forward["start"] and step["end"] == sync["end"]
        assert t0 - 2_000_000 <= step["start"] <= step["end"] <= t1 + 2_000_000
    for s in py:
        a = s["attributes"]
        assert a["code.function.name"] == f"python_frames.{s['name']}"
        assert a["code.file.path"] == WORKLOAD
        assert a["code.line.number"] == where[f"def {s['name'].split('.')[-1]}"]
        assert a["eacgm.python.bounds"] == "traced_calls"
        assert a["thread.id"] == run["attributes"]["thread.id"]
    assert {s["trace_id"] for s in spans} == {run["trace_id"]}


def test_python_exclude_applies_to_walked_frames(pipeline) -> None:  # noqa: ANN001
    proc, _, spans = traced(pipeline, INTERPRETERS["3.12"], env={"OTEL_EACGM_PYTHON_EXCLUDE": ":forward,:<module>"})
    kids = children(spans)
    steps = [s for s in spans if s["name"] == "step"]
    assert len(steps) == STEPS and not [s for s in spans if s["name"] == "forward"]
    for step in steps:  # forward's calls belong to the nearest frame left: step
        assert [c["name"] for c in kids[step["span_id"]]] == ["cudaSetDevice", "cudaMemset", "cudaDeviceSynchronize"]


def test_frames_off_leaves_calls_outermost(pipeline) -> None:  # noqa: ANN001
    _, _, spans = traced(pipeline, INTERPRETERS["3.12"], frames=False)
    assert {s["attributes"]["eacgm.layer"] for s in spans} == {"cuda.runtime"}
    assert all(s["parent_span_id"] == "" for s in spans) and len(spans) == 3 * STEPS


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_churned_code_objects_and_threads_never_get_a_wrong_name(pipeline, version: str) -> None:  # noqa: ANN001
    python = INTERPRETERS[version]
    if not python.exists():
        pytest.skip(f"{python} is not installed")
    rounds = 10
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "cuda.runtime", "--", str(python),
                    str(REPO / "tests/workloads/python_churn.py"), libcudart(), str(rounds))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, OTEL_EACGM_GPU_METRICS="0", OTEL_EACGM_SPAN_SAMPLE_RATIO="1",
                                   OTEL_EACGM_PYTHON_FRAMES="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]  # the traced program and the agent both ran through
    *made, end = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    spans = exported_spans(pipeline.store, end["pid"], proc.stderr)
    calls = [s for s in spans if s["name"] == "cudaSetDevice"]
    assert len(calls) == end["calls"] == rounds * 100
    generated = [s for s in spans if s["name"].startswith("gen_")]
    # code objects freed before the agent reads them go unnamed, and their calls belong to the
    # worker; those kept alive are named, and cached by address until the next round's code
    # objects reuse their memory: none may be named wrongly
    assert len(generated) >= rounds * 10, len(generated)
    by_id = {s["span_id"]: s for s in spans}
    for s in generated:
        k = int(s["name"].removeprefix("gen_"))
        a = s["attributes"]
        assert (a["code.file.path"], a["code.line.number"]) == (f"<churn-{k}>", k + 1), s["name"]
        assert by_id[s["parent_span_id"]]["name"] == "worker"
        assert by_id[s["parent_span_id"]]["attributes"]["thread.id"] == a["thread.id"]
    made_by: dict[int, list[int]] = collections.defaultdict(list)  # thread -> K of each call, in order
    for line in made:
        made_by[line["tid"]] += line["ks"]
    on_thread: dict[int, list[dict]] = collections.defaultdict(list)
    for call in sorted(calls, key=lambda s: s["start"]):
        on_thread[call["attributes"]["thread.id"]].append(call)
    assert {tid: len(c) for tid, c in on_thread.items()} == {tid: len(ks) for tid, ks in made_by.items()}
    for tid, thread_calls in on_thread.items():
        for call, k in zip(thread_calls, made_by[tid]):  # under the gen_K that made it, or unnamed under worker
            assert by_id[call["parent_span_id"]]["name"] in ("worker", f"gen_{k}"), (k, by_id[call["parent_span_id"]])
    workers = {s["attributes"]["thread.id"] for s in spans if s["name"] == "worker"}
    assert len(workers) == 4 * rounds + 1  # four short-lived threads per round, and the main thread


def torch_python(version: str) -> Path:
    """The interpreter of `version` in a venv with the torch wheel: Debian's 3.11 is the project's
    .venv, the pyenv ones are made once by scripts/torch-pyvenvs.sh (make test's set-up)."""
    if version == "3.11-debian":
        return Path(sys.executable)
    out = subprocess.run(["bash", str(REPO / "scripts/torch-pyvenvs.sh"), "--path", version],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def tree(span: dict, kids: dict[str, list[dict]]) -> tuple:
    """(name, its children's trees in start order): a span's whole subtree, by name."""
    return (span["name"], [tree(c, kids) for c in kids[span["span_id"]]])


def _op(name: str, *under: tuple) -> tuple:
    return (name, list(under))


_TO_COPY = _op("aten::to", _op("aten::_to_copy", _op("aten::copy_")))
_LINEAR = _op("Linear.forward", _op("aten::linear", _op("aten::addmm", _op("aten::copy_"))))
# One step of tests/workloads/torch_train.py as the torch layer and the frames make it: the
# forward pass under loss_of > TinyNet.forward > Linear.forward; backward's and SGD's operators
# straight under train_step (their Python frames are torch's own, in site-packages, excluded
# by default); an operator that dispatches to another (aten::mean > aten::mean) nests.
TRAIN_STEP = _op(
    "train_step",
    _op("loss_of",
        _op("TinyNet.forward", _LINEAR, _op("aten::relu"), _LINEAR),
        _op("aten::sub"), _op("aten::to"),
        _op("aten::mean", _op("aten::mean", _op("aten::div_", _op("aten::div_", _TO_COPY))))),
    _op("aten::div", _op("aten::div", _TO_COPY)), _op("aten::to"), _op("aten::copy_"),
    _op("aten::mul", _op("aten::mul", _TO_COPY)), _op("aten::mul"),
    _op("aten::mm"), _op("aten::mm"), _op("aten::sum"), _op("aten::threshold_backward"), _op("aten::mm"),
    _op("aten::sum"),
    *[_op("aten::add_")] * 4)
TORCH_STEPS = 2


@pytest.mark.parametrize("version", ["3.10", "3.11-debian", "3.12", "3.13"])
def test_torch_training_step_is_a_span_over_its_operators(pipeline, version: str) -> None:  # noqa: ANN001
    """A training loop in the torch venv of each interpreter (pyenv's have no USDT probes), no
    profile function set, nothing in the program: each train_step is a span over exactly the
    operators it ran, with its Python callees, the same tree on every version."""
    python = torch_python(version)
    if not python.exists():
        pytest.skip(f"{python} is not made (no pyenv CPython {version} here)")
    workload = str(REPO / "tests/workloads/torch_train.py")
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "torch", "--", str(python), workload, str(TORCH_STEPS))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, OTEL_EACGM_GPU_METRICS="0", OTEL_EACGM_PYTHON_FRAMES="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    minor = version.split("-")[0]
    assert f"Python {minor} frames are read" in proc.stderr, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    pid = next(line["tid"] for line in lines if "step" in line)
    spans = exported_spans(pipeline.store, pid, proc.stderr)
    kids = children(spans)
    by_id = {s["span_id"]: s for s in spans}
    steps = [s for s in spans if s["name"] == "train_step"]
    assert [tree(s, kids) for s in steps] == [TRAIN_STEP] * TORCH_STEPS
    assert len({s["parent_span_id"] for s in steps}) == 1 and by_id[steps[0]["parent_span_id"]]["name"] == "main"
    brackets = [(line["start"], line["end"]) for line in lines if "step" in line]
    for step, (t0, t1) in zip(steps, brackets):
        assert t0 - 2_000_000 <= step["start"] <= step["end"] <= t1 + 2_000_000
    site = python.parent.parent  # this venv's own torch: Linear.forward is read from its file
    for s in spans:
        a = s["attributes"]
        if s["name"] == "Linear.forward":
            assert a["code.function.name"] == "torch.nn.modules.linear.Linear.forward"
            assert a["code.file.path"].startswith(str(site)), a["code.file.path"]
            assert a["code.file.path"].endswith("/site-packages/torch/nn/modules/linear.py")
        elif a["eacgm.layer"] == "python":
            assert a["code.function.name"] == f"torch_train.{s['name']}" and a["code.file.path"] == workload
        if s["parent_span_id"]:  # children inside parents, on the parent's thread
            p = by_id[s["parent_span_id"]]
            assert p["start"] <= s["start"] <= s["end"] <= p["end"], (p["name"], s["name"])
            assert p["attributes"]["thread.id"] == s["attributes"]["thread.id"]


def test_an_unknown_interpreter_is_reported_once_and_its_calls_still_traced(pipeline) -> None:  # noqa: ANN001
    python = PYENV / "3.9.18/bin/python3.9"
    if not python.exists():
        pytest.skip(f"{python} is not installed")
    proc, _, spans = traced(pipeline, python)
    reports = [line for line in proc.stderr.splitlines() if "Python frames are not read in processes of" in line]
    assert len(reports) == 1 and "libpython3.9" in reports[0] and "CPython 3.9" in reports[0], reports
    assert collections.Counter(s["name"] for s in spans) == {
        "cudaSetDevice": STEPS, "cudaMemset": STEPS, "cudaDeviceSynchronize": STEPS}
    assert all(s["parent_span_id"] == "" for s in spans)


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_threads_switching_interpreters_never_get_a_wrong_name(pipeline, version: str) -> None:  # noqa: ANN001
    """Threads hop into subinterpreters of their own and back, which are then destroyed with
    their thread states and code objects: neither process fails, every call is exported, and
    each Python span names its own function. The walk searches the newest interpreter's thread
    list, so while a subinterpreter lives a main-interpreter thread it has not cached yet gets
    no frames (docs/tracing-layers.md): such calls stay outermost rather than misnamed."""
    python = INTERPRETERS[version]
    if not python.exists():
        pytest.skip(f"{python} is not installed")
    rounds = 10
    workload = REPO / "tests/workloads/python_interpreters.py"
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "cuda.runtime", "--", str(python), str(workload), libcudart(),
                    str(rounds))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, OTEL_EACGM_GPU_METRICS="0", OTEL_EACGM_PYTHON_FRAMES="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]  # the traced program and the agent both ran through
    (end,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    spans = exported_spans(pipeline.store, end["pid"], proc.stderr)
    by_id = {s["span_id"]: s for s in spans}
    calls = [s for s in spans if s["name"] == "cudaSetDevice"]
    assert len(calls) == end["calls"] == rounds * 9
    hop_line = next(n.lineno for n in ast.walk(ast.parse(workload.read_text()))
                    if isinstance(n, ast.FunctionDef) and n.name == "hop")
    named = [s for s in spans if s["attributes"]["eacgm.layer"] == "python"]
    # Whether any frame is read here is a race: the walk searches only the newest interpreter's
    # thread list, and every thread makes its own subinterpreter (many runs name none). What
    # holds every time: both processes run through, every call arrives, and a name given is right.
    for s in named:
        a = s["attributes"]
        if s["name"] == "hop":
            assert (a["code.file.path"], a["code.line.number"]) == (str(workload), hop_line)
        else:
            k = int(s["name"].removeprefix("sub_"))
            assert (a["code.file.path"], a["code.line.number"]) == (f"<sub-{k}>", k + 1), s["name"]
    for call in calls:
        if call["parent_span_id"]:
            parent = by_id[call["parent_span_id"]]
            assert parent["attributes"]["eacgm.layer"] == "python"
            assert parent["attributes"]["thread.id"] == call["attributes"]["thread.id"]
