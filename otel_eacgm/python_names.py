"""Names of Python functions seen through USDT: module, qualified name, from the source file.

CPython 3.11's function__entry gives the file, ``co_name`` and the current line, not the
qualified name; the source file (read once, through the process' root) gives it back: the
innermost ``def`` called ``co_name`` whose lines hold the probe's line is the function, and
its enclosing classes and functions make the qualified name (``Linear.forward``).
"""

from __future__ import annotations

import ast
import functools
import os

_PACKAGE_DIRS = ("site-packages", "dist-packages")


def module_name(path: str) -> str:
    """Dotted module name of a source file (relative to site-packages or the stdlib), best effort."""
    if not path.startswith("/"):
        return path
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in _PACKAGE_DIRS or (parts[i].startswith("python3.") and i > 0 and parts[i - 1] == "lib"):
            parts = parts[i + 1:]
            break
    else:
        parts = parts[-1:]
    if not parts:
        return path
    parts[-1] = parts[-1].rsplit(".", 1)[0]
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _definitions(source: str) -> list[tuple[int, int, str, str]]:
    """(first line, last line, name, qualified name) of every function in a module."""
    out: list[tuple[int, int, str, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                qual = f"{prefix}{child.name}"
                out.append((first, child.end_lineno or child.lineno, child.name, qual))
                visit(child, f"{qual}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


@functools.lru_cache(maxsize=512)
def _file_definitions(path: str) -> tuple[tuple[int, int, str, str], ...]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return tuple(_definitions(fh.read()))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return ()


class PythonNames:
    """Resolves (pid, file, co_name, line) to (qualified name, module-qualified name), cached."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._cache: dict[tuple[str, str, int], tuple[str, str]] = {}

    def _defs(self, pid: int, path: str) -> tuple[tuple[int, int, str, str], ...]:
        found = _file_definitions(f"{self._proc}/{pid}/root{path}") if path.startswith("/") else ()
        if not found and os.path.isabs(path):
            found = _file_definitions(path)
        return found

    def names(self, pid: int, path: str, function: str, line: int) -> tuple[str, str]:
        """(qualname, module.qualname); falls back to the bare function name."""
        key = (path, function, line)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        qual = function
        best = None
        for first, last, name, qualname in self._defs(pid, path):
            if name == function and first <= line <= last and (best is None or first >= best[0]):
                best = (first, qualname)
        if best is not None:
            qual = best[1]
        module = module_name(path)
        result = (qual, f"{module}.{qual}" if module and not module.startswith("<") else qual)
        if len(self._cache) > 65536:
            self._cache.clear()
        self._cache[key] = result
        return result
