"""A command's process: `run_main` turns a user's error into one line and an exit code, SIGTERM into the same stop as Ctrl+C, and finds the user's error inside Ray's wrappers."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import traceback

from convsts.io.errors import BadInputError, ConfigError, StorageError, TrackingError
from convsts.io.redaction import redact
from convsts.ray_jobs.runtime.logs import VERBOSE_ENV

# Expected user errors: one line and exit 2 (run_main), never a traceback.
# A full disk, a quota or the file-size limit: one line naming the file, not a traceback.
# A read-only file system too: where the command had to write (its --out) is the user's to change.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


USER_ERRORS = (
    ConfigError,
    TrackingError,
    BadInputError,
    StorageError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    PermissionError,
)


def find_user_error(exc: BaseException) -> BaseException | None:
    """The expected user error (bad config, bad or missing input) behind `exc`, also when Ray
    wrapped it (a task's error travels as RayTaskError with `.cause`, Ray Data's as UserCodeException)."""
    types, seen, first = USER_ERRORS, set(), None
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        inner = getattr(e, "cause", None)  # Ray's wrapper is an instance of the cause's class too
        if isinstance(e, OSError) and e.errno in DISK_FULL:  # under whatever failed after it (a store's write)
            return e
        if isinstance(e, types):
            if not isinstance(inner, BaseException):
                return e
            first = first or e
        todo += [inner, e.__cause__, e.__context__]
    return first


# Ray Data logs a failed task's traceback (and calls it an internal error) before raising it to
# the caller; for a user error that the command reports in one line, those records are dropped.
RAY_DATA_ERROR_LOGGERS = ("ray.data._internal.execution.streaming_executor_state", "ray.data.exceptions")


class UserErrorLogFilter(logging.Filter):
    """Drops log records about an exception (attached, or being handled while logging) that is an
    expected user error: run_main prints it as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        return exc is None or find_user_error(exc) is None


class SigtermAsInterrupt:
    """The SIGTERM handler of a command: SIGTERM (`convsts jobs stop`, `kill`, `timeout`, a scheduler)
    unwinds as Ctrl+C does (temporary folders removed, the MLflow run ended KILLED). It remembers the
    signal, since a library may raise a KeyboardInterrupt of its own for it (Ray's `ray.get` does).
    Its one line (`line`) is printed at once: whoever sent SIGTERM may send SIGKILL a few seconds
    later (a stopped Ray job's driver gets it after RAY_JOB_STOP_WAIT_TIME_S, 3 s), before the
    clean-up is done."""

    def __init__(self, line: str = "") -> None:
        self.received: int | None = None
        self.line = line

    def __call__(self, signum: int, frame) -> None:
        if self.received is None and self.line:
            _write_line(self.line)
        self.received = signum
        raise KeyboardInterrupt(signum)


def _write_line(line: str) -> None:
    """`line` to stderr from a signal handler: straight to its file descriptor, since the handler may
    run while the main thread is inside a write to sys.stderr (a second write there raises)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stand-in stream without one (a test's capture)
        print(line, file=sys.stderr, flush=True)
    else:
        os.write(fd, f"{line}\n".encode())


GO_ON = "run the same command again to go on"  # what a stopped command's line advises, unless it says its own


def run_main(command: str, main, argv=None, go_on: str = GO_ON) -> int:
    """Run a command's main: an expected user error prints one line naming the file, row or key
    and exits 2, without a traceback; `--debug` (or CONVSTS_DEBUG=1) shows the traceback instead.
    `--verbose` (or CONVSTS_VERBOSE=1) also shows Ray's progress bars and info logs. Ctrl+C and
    SIGTERM end it with one line, `go_on` saying how to continue, and exit 128 + the signal."""

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("CONVSTS_DEBUG") == "1"
    if "--verbose" in argv:  # Ray's progress bars and info logs too; read by ensure_ray and setup_logging
        os.environ[VERBOSE_ENV] = "1"
    argv = [a for a in argv if a not in ("--debug", "--verbose")]
    if not debug:
        for name in RAY_DATA_ERROR_LOGGERS:
            logging.getLogger(name).addFilter(UserErrorLogFilter())

    def stopped(signum: int) -> str:
        return f"convsts {command}: stopped by {signal.Signals(signum).name}; {go_on}"

    sigterm = SigtermAsInterrupt(stopped(signal.SIGTERM))
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a handler of the caller's own stays
        signal.signal(signal.SIGTERM, sigterm)
    try:
        return int(main(argv) or 0)
    except KeyboardInterrupt:  # Ctrl+C or SIGTERM: what the command made is cleaned up on the way out
        if sigterm.received is None:  # Ctrl+C (SIGTERM's line was printed when it came)
            print(stopped(signal.SIGINT), file=sys.stderr)
        return 128 + (sigterm.received or signal.SIGINT)
    except Exception as exc:
        found = None if debug else find_user_error(exc)
        if found is None:  # the traceback, with any credential a message or URI carried redacted
            print(redact("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
            return 1
        message = str(found.args[0] if len(found.args) == 1 and isinstance(found.args[0], str) else found)
        if isinstance(found, OSError) and found.filename and str(found.filename) not in message:
            message = f"{found.filename}: {message}"
        line = redact(message.strip().splitlines()[0])
        print(f"convsts {command}: {line} (--debug shows the traceback)", file=sys.stderr)
        return 2
