"""A context manager that keeps libraries' progress chatter off the console while one call runs;
the caller reports the result in one line of its own."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def quiet_loggers(names: Sequence[str], env: dict[str, str] | None = None) -> Iterator[None]:
    """The named loggers at ERROR, Python warnings ignored and `env` set, all restored afterwards."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    saved = {k: os.environ.get(k) for k in (env or {})}
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    os.environ.update(env or {})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
