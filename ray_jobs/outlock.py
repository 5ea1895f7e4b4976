"""One run at a time in an output folder: an exclusive lock on OUT/.convsts.lock, held for the whole
run. A second run into the same --out (two `convsts train` started together, a demo beside a
training) is refused in one line naming the holder, before it writes anything there: before the
lock, both exited 0 and the second's checkpoint, model and train.json replaced the first's, or the
second died in an alembic migration traceback of the MLflow store they both created.

The lock is the operating system's (flock on an open file): it goes with the process that holds
it, however that process ends (a killed run leaves no stale lock to clean up), and within one
process it is re-entrant (the demo's training runs in the demo's own --out)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".convsts.lock"


class OutputInUse(FileExistsError):
    """The output folder is held by another run."""


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def output_lock(out_dir: str | Path, command: str) -> Iterator[None]:
    """Hold out_dir for this run (created when missing); refuse when another process holds it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = _holder(path)
        if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            yield  # this process holds it already (a demo's training in the demo's folder)
            return
        raise OutputInUse(
            f"{out_dir} is in use by another run (`convsts {holder.get('command', '?')}`, pid "
            f"{holder.get('pid', '?')} on {holder.get('host', '?')}, since {holder.get('since', '?')}): wait for it "
            f"to end, or choose another --out"
        ) from None
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        record = {"command": command, "pid": os.getpid(), "host": socket.gethostname(), "since": since}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({**record, "argv": sys.argv[1:][:20]}).encode())
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
