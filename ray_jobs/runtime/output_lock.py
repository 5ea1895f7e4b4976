"""One run at a time in an output folder: an exclusive lock on OUT/.convsts.lock, held for the whole
run. A second run into the same --out (two `convsts train` started together, a demo beside a
training, two prepares) is refused in one line naming the holder, before it writes anything
there: two runs would replace each other's checkpoint, model and train.json, and race to create
the MLflow store they share.

The lock is the operating system's (flock on an open file): it goes with the process that holds
it, however that process ends (a killed run leaves no stale lock to clean up), and within one
process it is re-entrant (the demo's training runs in the demo's own --out)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import json
import os
import socket
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
    """Hold out_dir for this run (created when missing); refuse when another process holds it. The
    lock file is removed when the run ends, and the folders made for it when they are left empty: a
    refused or finished run leaves nothing of its own."""
    out_dir = Path(out_dir)
    made = _missing_folders(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_FILE
    fd = _acquire(path, out_dir)
    if fd is None:
        yield  # this process holds it already (a demo's training in the demo's folder)
        return
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        record = {"command": command, "pid": os.getpid(), "host": socket.gethostname(), "since": since}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode())  # no arguments: they may carry credentials
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # removed while still held: a process that opened it before sees a removed file
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        for folder in made:  # innermost first; one that holds anything stays, and so do those above it
            try:
                folder.rmdir()
            except OSError:
                break


def _missing_folders(out_dir: Path) -> list[Path]:
    """The folders of `out_dir` (itself, then its parents) that do not exist yet, innermost first."""
    missing = []
    for folder in (out_dir, *out_dir.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing


def holds_output(command: str):
    """Decorator: the function runs holding its `out_dir` argument (output_lock) from start to end."""

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def held(*args, **kwargs):
            out_dir = signature.bind(*args, **kwargs).arguments["out_dir"]
            with output_lock(Path(out_dir).resolve(), command):
                return fn(*args, **kwargs)

        return held

    return decorate


def _acquire(path: Path, out_dir: Path) -> int | None:
    """The locked descriptor of `path`; None when this process holds it already."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _holder(path)
            if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                return None
            raise OutputInUse(
                f"{out_dir} is in use by another run (`convsts {holder.get('command', '?')}`, pid "
                f"{holder.get('pid', '?')} on {holder.get('host', '?')}, since {holder.get('since', '?')}): wait "
                f"for it to end, or choose another --out"
            ) from None
        try:  # the holder before may have removed the file between our open and our lock: lock the new one
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
