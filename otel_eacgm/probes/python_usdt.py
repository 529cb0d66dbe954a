"""CPython's function__entry / function__return USDT probes, and the rules that filter them.

An interpreter built ``--with-dtrace`` (Debian's /usr/bin/python3.11, most distribution
Pythons) carries the probes in its executable or in libpython3.X.so; pyenv and python.org
builds usually do not. The probes are guarded by semaphores: the agent attaches with the
kernel's reference counter (ref_ctr_offset), so every process mapping the file turns them on,
including processes started later, and they cost nothing while the agent is not attached.

Filtering happens in the kernel (calls.bpf.c, py_traced): a rule names path components (a
dotted module such as ``torch.nn.modules`` or a path part such as ``site-packages``), a
function name, or a file name prefix (``<frozen``); the first matching rule decides.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path

from otel_eacgm.events import PY_RULES, PyRule
from otel_eacgm.probes.elf import ElfError, ElfFile

# struct pt_regs (x86-64) byte offsets, by register name as in USDT argument specs.
_PT_REGS = {
    "r15": 0, "r14": 8, "r13": 16, "r12": 24, "rbp": 32, "rbx": 40, "r11": 48, "r10": 56, "r9": 64,
    "r8": 72, "rax": 80, "rcx": 88, "rdx": 96, "rsi": 104, "rdi": 112,
}
_ALIASES = {"ebp": "rbp", "ebx": "rbx", "eax": "rax", "ecx": "rcx", "edx": "rdx", "esi": "rsi", "edi": "rdi",
            **{f"r{i}d": f"r{i}" for i in range(8, 16)}}
_ARG = re.compile(r"^-?\d+@%(\w+)$")

FNV_OFFSET, FNV_PRIME = 2166136261, 16777619

# Not the user's code: the standard library, installed packages, frozen and generated code, and
# the module body itself (it would enclose the whole program). torch.nn modules' forward is
# the exception that matters for time, so it comes first.
DEFAULT_INCLUDE: tuple[str, ...] = ("torch.nn.modules:forward",)
DEFAULT_EXCLUDE: tuple[str, ...] = (
    ":<module>", "<frozen", "<string>", "site-packages", "dist-packages",
    *(f"python3.{minor}" for minor in range(8, 16)),
)


class UsdtError(ValueError):
    """The interpreter has no usable function probes."""


@dataclasses.dataclass(frozen=True)
class PythonProbes:
    """Where to attach in one interpreter file (file offsets, as the uprobe interface takes)."""

    path: str
    entry_offset: int
    return_offset: int
    entry_semaphore: int   # file offset of the semaphore, 0: none
    return_semaphore: int
    arg_regs: tuple[int, int, int]  # pt_regs offsets of (file name, function name, line number)


def _arg_regs(spec: str, path: str) -> tuple[int, int, int]:
    args = spec.split()
    if len(args) < 3:
        raise UsdtError(f"{path}: function__entry has arguments {spec!r}, expected 3 (file, function, line)")
    out = []
    for arg in args[:3]:
        m = _ARG.match(arg)
        reg = _ALIASES.get(m.group(1), m.group(1)) if m else None
        if reg not in _PT_REGS:
            raise UsdtError(f"{path}: USDT argument {arg!r} is not a plain register; only register arguments "
                            "are supported (found in spec {spec!r})")
        out.append(_PT_REGS[reg])
    return out[0], out[1], out[2]


def find_probes(path: str) -> PythonProbes:
    """The function probes of an interpreter executable or libpython; raises UsdtError if absent."""
    try:
        with ElfFile(path) as elf:
            notes = {n.name: n for n in elf.usdt_notes() if n.provider == "python"}
            entry, ret = notes.get("function__entry"), notes.get("function__return")
            if entry is None or ret is None:
                raise UsdtError(f"{path} has no python:function__entry/function__return USDT probes "
                                "(an interpreter built --with-dtrace has them, e.g. Debian's /usr/bin/python3)")
            base = elf.section(".stapsdt.base")
            # Prelinking moves .stapsdt.base; the notes record where it was at link time.
            def pc(note) -> int:  # noqa: ANN001
                shift = base.addr - note.base if base is not None and note.base else 0
                return elf.file_offset(note.pc + shift)

            def sem(note) -> int:  # noqa: ANN001
                return elf.file_offset(note.semaphore) if note.semaphore else 0

            return PythonProbes(path, pc(entry), pc(ret), sem(entry), sem(ret), _arg_regs(entry.args, path))
    except (OSError, ElfError) as exc:
        raise UsdtError(f"{path}: cannot read USDT notes ({exc})") from None


def has_probes(path: str) -> bool:
    """Whether the interpreter at `path` has function probes (doctor, agent log)."""
    try:
        find_probes(path)
    except UsdtError:
        return False
    return True


FIRES = "function probes present"
CPYTHON_311_NOTE = ("CPython 3.11 fires function__entry only while a profile or trace function is set "
                    "(gh-98894): Python spans appear under profilers and coverage, not in a plain run")


def interpreter_note(path: str) -> str:
    """What Python function tracing can do with the interpreter at `path` (CPython's probes vary
    by version: 3.11 fires entries only under a tracer, 3.12-3.14 have no function probes)."""
    real = os.path.realpath(path)
    candidates = [real, *(str(p) for p in Path(real).parent.parent.glob("lib/libpython3*.so*"))]
    found = next((c for c in candidates if has_probes(c)), None)
    if found is None:
        return "no function probes (CPython 3.12-3.14 have none, gh-104280; others need --with-dtrace)"
    if re.search(r"python3\.11", os.path.basename(found)):
        return f"function probes present, but {CPYTHON_311_NOTE}"
    return FIRES


def fnv1a(text: str) -> int:
    """32-bit FNV-1a of the UTF-8 bytes, as calls.bpf.c computes it."""
    h = FNV_OFFSET
    for b in text.encode():
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFF
    return h


@dataclasses.dataclass(frozen=True)
class Rule:
    """One parsed pattern: ``MODULE_OR_PATH[:FUNCTION]``, ``:FUNCTION`` or ``<PREFIX``."""

    include: bool
    components: tuple[str, ...] = ()
    function: str = ""
    prefix: str = ""

    @classmethod
    def parse(cls, pattern: str, include: bool) -> Rule:
        """Parse a python_include / python_exclude pattern; raises ValueError naming it."""
        text = pattern.strip()
        if text.startswith("<"):
            if len(text.encode()) > 16:
                raise ValueError(f"python pattern {pattern!r}: a file prefix is at most 16 bytes")
            return cls(include, prefix=text)
        where, _, func = text.partition(":")
        func = "" if func in ("", "*") else func
        parts = tuple(p for p in re.split(r"[./]", where) if p) if "/" in where or where.count(".") else \
            ((where,) if where else ())
        # "python3.11" is one directory name, not the modules python3 and 11
        if re.fullmatch(r"python\d+\.\d+", where):
            parts = (where,)
        if not parts and not func:
            raise ValueError(f"python pattern {pattern!r} names neither a module/path nor a function")
        if any(p == "*" for p in parts) or "*" in func:
            raise ValueError(f"python pattern {pattern!r}: wildcards are only allowed as the whole function ('mod:*')")
        return cls(include, parts, func)


def compile_rules(include: Sequence[str], exclude: Sequence[str], *, default_include: bool = True
                  ) -> tuple[list[PyRule], dict[int, int]]:
    """Patterns -> (py_rules entries, py_names: component hash -> bit). Includes come first.

    The last rule matches everything and carries `default_include` (the user's own code).
    """
    rules = [Rule.parse(p, True) for p in include] + [Rule.parse(p, False) for p in exclude]
    if len(rules) + 1 > PY_RULES:
        raise ValueError(f"{len(rules)} python_include/python_exclude patterns, at most {PY_RULES - 1} fit")
    names: dict[str, int] = {}
    out = []
    for rule in rules:
        need = 0
        for comp in rule.components:
            if comp not in names:
                if len(names) == 64:
                    raise ValueError("python patterns name more than 64 distinct path components")
                names[comp] = len(names)
            need |= 1 << names[comp]
        prefix = rule.prefix.encode()
        out.append(PyRule(used=1, include=int(rule.include), prefix_len=len(prefix),
                          func_hash=fnv1a(rule.function) if rule.function else 0, need=need, prefix=prefix))
    out.append(PyRule(used=1, include=int(default_include)))
    bits: dict[int, int] = {}
    for comp, bit in names.items():
        h = fnv1a(comp)
        bits[h] = bits.get(h, 0) | (1 << bit)
    return out, bits


def rule_matches(rule: Rule, file: str, function: str) -> bool:
    """Python model of the kernel's rule test (tests compare the two)."""
    if rule.function and rule.function != function:
        return False
    if rule.prefix and not file.startswith(rule.prefix):
        return False
    comps = [c for c in file.split("/") if c]
    if comps and "." in comps[-1]:
        comps[-1] = comps[-1].rsplit(".", 1)[0]
    return all(c in comps for c in rule.components)
