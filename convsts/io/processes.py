"""Whether a process runs, by its pid: what the reaper, the spill cleanup and the tests ask."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not yet waited for, does not; another user's does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
    except OSError:  # it ended just now, or this system has no /proc (then kill's answer stands)
        return not stat.parent.parent.is_dir()
