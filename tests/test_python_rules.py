"""Python filter patterns: parsing, the rule table the kernel gets, and the module/qualname lookup."""

from __future__ import annotations

import pytest

from otel_eacgm.probes.python_usdt import (DEFAULT_EXCLUDE, DEFAULT_INCLUDE, Rule, compile_rules, find_probes, fnv1a,
                                           rule_matches)
from otel_eacgm.python_names import PythonNames, module_name


def decide(file: str, func: str, include=DEFAULT_INCLUDE, exclude=DEFAULT_EXCLUDE) -> bool:  # noqa: ANN001
    """The first-match decision, as the kernel takes it."""
    for rule in [Rule.parse(p, True) for p in include] + [Rule.parse(p, False) for p in exclude]:
        if rule_matches(rule, file, func):
            return rule.include
    return True


@pytest.mark.parametrize(("file", "func", "traced"), [
    ("/home/u/proj/train.py", "train_step", True),                                   # user code
    ("/home/u/proj/train.py", "<module>", False),                                    # module bodies
    ("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "forward", True),
    ("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", "_call_impl", False),
    ("/venv/lib/python3.11/site-packages/numpy/core/numeric.py", "ones", False),
    ("/usr/lib/python3.11/json/encoder.py", "encode", False),
    ("/usr/lib/python3/dist-packages/yaml/__init__.py", "load", False),
    ("<frozen importlib._bootstrap>", "_find_and_load", False),
])
def test_default_rules(file: str, func: str, traced: bool) -> None:
    assert decide(file, func) is traced


def test_pattern_forms() -> None:
    assert Rule.parse("torch.nn.modules:forward", True) == Rule(True, ("torch", "nn", "modules"), "forward")
    assert Rule.parse("mypkg/sub", False) == Rule(False, ("mypkg", "sub"))
    assert Rule.parse(":step", True) == Rule(True, (), "step")
    assert Rule.parse("python3.11", False) == Rule(False, ("python3.11",))
    assert Rule.parse("<frozen", False) == Rule(False, prefix="<frozen")
    assert Rule.parse("train:*", True) == Rule(True, ("train",))
    for bad in ("", ":", "a.*", "<" + "x" * 20):
        with pytest.raises(ValueError, match="python pattern"):
            Rule.parse(bad, True)


def test_compiled_table() -> None:
    rules, names = compile_rules(["torch.nn.modules:forward"], ["site-packages"])
    assert [(r.include, r.func_hash, r.need) for r in rules] == [
        (1, fnv1a("forward"), 0b111), (0, 0, 0b1000), (1, 0, 0)]   # last: the catch-all default
    assert names == {fnv1a("torch"): 1, fnv1a("nn"): 2, fnv1a("modules"): 4, fnv1a("site-packages"): 8}
    assert fnv1a("") == 2166136261 and fnv1a("a") == 0xE40C292C  # FNV-1a reference values
    with pytest.raises(ValueError, match="at most 15 fit"):
        compile_rules([f"m{i}" for i in range(16)], [])


def test_module_and_qualified_names(tmp_path) -> None:  # noqa: ANN001
    src = tmp_path / "train.py"
    src.write_text("class Net:\n    @staticmethod\n    def forward(x):\n        return x\n\n"
                   "def outer():\n    def step():\n        pass\n    return step\n")
    names = PythonNames(proc=str(tmp_path / "noproc"))
    assert names.names(1, str(src), "forward", 3) == ("Net.forward", "train.Net.forward")
    assert names.names(1, str(src), "forward", 2) == ("Net.forward", "train.Net.forward")  # decorator line
    assert names.names(1, str(src), "step", 7) == ("outer.<locals>.step", "train.outer.<locals>.step")
    assert names.names(1, str(src), "gone", 99) == ("gone", "train.gone")
    assert module_name("/v/lib/python3.11/site-packages/torch/nn/modules/linear.py") == "torch.nn.modules.linear"
    assert module_name("/usr/lib/python3.11/json/__init__.py") == "json"
    assert module_name("<frozen importlib._bootstrap>") == "<frozen importlib._bootstrap>"


def test_debian_interpreter_probes() -> None:
    probes = find_probes("/usr/bin/python3.11")
    assert probes.entry_offset and probes.return_offset and probes.entry_semaphore
    assert probes.arg_regs == (32, 24, 80)  # %rbp, %r12, %eax in struct pt_regs
