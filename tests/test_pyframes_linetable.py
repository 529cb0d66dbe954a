"""The line tables of code objects, decoded as the agent does, against each real interpreter's
own answer (co_lines) for every instruction of a few functions with loops, branches and
multi-line expressions."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from otel_eacgm.pyframes.code_objects import line_310, line_311

PYENV = Path("/root/.pyenv/versions")
INTERPRETERS = [PYENV / "3.10.13/bin/python3.10", PYENV / "3.11.7/bin/python3.11", Path("/usr/bin/python3.11"),
                PYENV / "3.12.1/bin/python3.12", PYENV / "3.13.0/bin/python3.13"]

# Prints, per function: its line table, first line, and (byte offset, line) of each instruction.
DUMP = '''
import json, sys

def looped(xs):
    total = 0
    for x in xs:
        if x % 2:
            total += (x *
                      2)
        else:
            total -= x
    return total

class K:
    def meth(self, a,
             b):
        try:
            return [a
                    for _ in range(b)]
        except ValueError:
            return None

out = []
codes = [looped.__code__, K.meth.__code__]
codes += [c for c in K.meth.__code__.co_consts if hasattr(c, "co_lines")]  # the comprehension's own, < 3.12
for code in codes:
    lines = [(off, line) for start, end, line in code.co_lines() for off in range(start, end, 2)]
    out.append({"table": code.co_linetable.hex(), "first": code.co_firstlineno, "lines": lines})
print(json.dumps({"minor": sys.version_info[1], "codes": out}))
'''


@pytest.mark.parametrize("python", INTERPRETERS, ids=lambda p: str(p))
def test_line_of_every_instruction_matches_the_interpreter(python: Path) -> None:
    if not python.exists():
        pytest.skip(f"{python} is not installed")
    got = json.loads(subprocess.run([str(python), "-c", DUMP], capture_output=True, text=True, check=True).stdout)
    decode = line_310 if got["minor"] < 11 else line_311
    checked = 0
    for code in got["codes"]:
        table = bytes.fromhex(code["table"])
        for offset, line in code["lines"]:
            if line is None:
                continue
            assert decode(table, code["first"], offset) == line, (python, offset)
            checked += 1
    assert checked > 30
