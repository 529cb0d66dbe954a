"""/proc/PID/stat read once for everyone who needs one of its fields."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """`pid`'s /proc/PID/stat fields after the command name (index 0 is field 3, the state), split
    after the last ")" since the name may hold spaces and parentheses; None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
