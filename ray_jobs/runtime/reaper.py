"""The reaper of a command's own local Ray instance: a process of its own session that ends every
process of the instance once the command is gone, however it went (SIGKILL, an OOM kill), so that
no Ray process of the instance outlives the command. Ray ends them itself only after a minute or
more (a dashboard agent notices its raylet is gone late).

  python -m convsts.ray_jobs.runtime.reaper DRIVER_PID SESSION_DIR

While the driver lives it notes, every POLL_S, the processes whose command line names the
instance's session folder and their descendants (Ray renames its agents, so a descendant is only
known while its parent lives); when the driver is gone it SIGKILLs each of them still there."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from convsts.io.processes import alive, parent_and_start

POLL_S = 0.5
REAP_S = 30.0  # the reaper kills the instance's processes again for at most this long


def processes(names: dict[tuple[int, int], str] | None = None) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line), from /proc. `names` keeps each process's command line by
    (pid, start time) between calls: a poll then reads one file of a process it has seen, not two. A
    name read between a fork and its exec stays its parent's: a child of the instance's processes is
    theirs as a descendant, and the instance's own first processes were started before the reaper."""
    names = {} if names is None else names
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (found := parent_and_start(int(entry))) is None:
            continue
        key = (int(entry), found[1])  # the pid and its start time: a reused pid is another process
        if key not in names:
            with contextlib.suppress(OSError):
                names[key] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        if key in names:
            out[int(entry)] = (found[0], names[key])
    for gone in [key for key in names if key[0] not in out]:
        del names[gone]
    return out


def instance_processes(session_dir: str, known: set[int], names: dict[tuple[int, int], str] | None = None) -> set[int]:
    """The processes naming `session_dir`, the ones in `known` still there, and all their descendants."""
    procs = processes(names)
    found = {pid for pid, (_, cmd) in procs.items() if session_dir in cmd} | (known & procs.keys())
    found.discard(os.getpid())
    while children := {pid for pid, (ppid, _) in procs.items() if ppid in found} - found - {os.getpid()}:
        found |= children
    return found


def reap(driver: int, session_dir: str) -> None:
    known: set[int] = set()
    names: dict[tuple[int, int], str] = {}
    while alive(driver):
        known = instance_processes(session_dir, known, names)
        time.sleep(POLL_S)
    # Again until none is left: a process that one killed had started meanwhile is ended too.
    deadline = time.monotonic() + REAP_S
    while (left := [p for p in instance_processes(session_dir, known) if alive(p)]) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        known |= set(left)
        time.sleep(POLL_S / 5)


def start_reaper(session_dir: str) -> None:
    """The reaper of this process's local instance, in a session of its own (a Ctrl+C to the
    command's process group does not stop it first). Linux only (/proc); elsewhere Ray's own
    clean-up is all there is."""
    if not Path("/proc/self/stat").exists():
        return
    subprocess.Popen(
        [sys.executable, "-m", "convsts.ray_jobs.runtime.reaper", str(os.getpid()), session_dir],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


if __name__ == "__main__":
    reap(int(sys.argv[1]), sys.argv[2])
