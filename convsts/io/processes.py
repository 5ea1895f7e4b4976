"""A process asked about by its pid: whether it runs, and when it started (which tells it from a
later process given the same pid). What the reaper, the spill cleanup and the tests ask."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not yet waited for, does not; another user's does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    fields = _stat_fields(pid)
    return fields is None or fields[0] != "Z"  # no /proc to ask: kill's answer stands


def start_time(pid: int) -> int | None:
    """The process's start (clock ticks since boot), or None where it is gone or /proc cannot say."""
    found = parent_and_start(pid)
    return found[1] if found is not None else None


def parent_and_start(pid: int) -> tuple[int, int] | None:
    """(its parent's pid, its start in clock ticks since boot), or None where it is gone or /proc cannot say."""
    fields = _stat_fields(pid)
    return (int(fields[1]), int(fields[19])) if fields is not None and len(fields) > 19 else None
