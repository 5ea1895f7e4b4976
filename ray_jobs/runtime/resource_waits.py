"""A fit whose worker group waits for resources says so, in one line, instead of waiting in silence.

Ray Train places a worker group as one placement group and waits up to
`RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S` (60 s by default) for it: after a lost node its view of the
node lags, a killed run's reservation may still stand, a cluster may be too busy. Meanwhile nothing
of the run moves and nothing says why. `saying_resource_waits` watches the cluster's placement
groups while a fit runs; one made since the fit started that stays pending `after_s` is said once:
what it asks for, how long it has waited, and how long Ray Train gives it before it tries again."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("convsts")

START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
DEFAULT_START_TIMEOUT_S = 60.0  # Ray Train's
AFTER_S = 10.0  # a worker group pending this long is said
POLL_S = 2.0


def wait_line(info: dict[str, Any], waited_s: float) -> str:
    """The one line of a placement group that has waited `waited_s`."""
    bundles = list((info.get("bundles") or {}).values())
    asks = ", ".join(f"{k} {v:g}" for k, v in sorted((bundles[0] if bundles else {}).items()))
    timeout = float(os.environ.get(START_TIMEOUT_ENV, DEFAULT_START_TIMEOUT_S))
    return (
        f"the worker group waits for resources Ray cannot place now: {len(bundles)} worker(s) of {{{asks}}}, "
        f"pending {waited_s:.0f} s; Ray Train gives it up to {timeout:g} s ({START_TIMEOUT_ENV}), then starts "
        f"it again (an elastic group at the size that fits); Ctrl+C stops the run"
    )


@contextlib.contextmanager
def saying_resource_waits(after_s: float = AFTER_S, poll_s: float = POLL_S) -> Iterator[None]:
    """While the block runs, each placement group made since it started that stays pending `after_s`
    is said in one line (wait_line), once."""
    import ray

    before = set(ray.util.placement_group_table())
    stop = threading.Event()

    def watch() -> None:
        pending_since: dict[str, float] = {}
        said: set[str] = set()
        while not stop.wait(poll_s):
            try:
                table = ray.util.placement_group_table()
            except Exception:  # noqa: BLE001 - a lost head or a shutdown: nothing to say here
                continue
            now = time.monotonic()
            for group, info in table.items():
                if group in before or group in said:
                    continue
                if info.get("state") != "PENDING":
                    pending_since.pop(group, None)
                    continue
                since = pending_since.setdefault(group, now)
                if now - since >= after_s:
                    said.add(group)
                    log.warning("%s", wait_line(info, now - since))

    thread = threading.Thread(target=watch, daemon=True, name="convsts-resource-waits")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2 * poll_s)
