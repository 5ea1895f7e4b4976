"""A fit whose worker group waits for resources says so, in one line, instead of waiting in silence.

Ray Train places a worker group as one placement group and waits up to
`RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S` (60 s by default) for it: after a lost node its view of the
node lags, a killed run's reservation may still stand, a cluster may be too busy. Meanwhile nothing
of the run moves and nothing says why. `saying_resource_waits` watches the cluster's placement
groups while a fit runs; one of this driver's job (Ray Train's controller is an actor of it) made
since the fit started that stays pending `after_s` is said once: what it asks for, how long it has
waited, and how long Ray Train gives it before it tries again. Another driver's group on the same
cluster is never said.

A placement group's id ends with its job's id (Ray's `PlacementGroupID.of(job)`): the one way to
tell a group's job that does not ask Ray's state API, which may not answer on a loaded cluster. The
layout is checked once against `PlacementGroupID.of` itself; where it does not hold (a Ray release
that changed it) the run says so in one warning line and says any new group's wait, as it cannot
tell them apart (docs/design.md, "Ray internals the project relies on")."""

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


def own_job_suffix() -> str | None:
    """The hex that the ids of this driver's job's placement groups end with, or None (said in one
    warning line) where Ray's ids no longer end with their job's."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    try:
        holds = ray.PlacementGroupID.of(ray.JobID.from_hex(job)).hex().endswith(job)
    except Exception:  # noqa: BLE001 - a changed or missing id API: the same fallback
        holds = False
    if not holds:
        log.warning(
            "this Ray's placement group ids do not end with their job's id: a wait of any placement group made "
            "during the fit is said as this fit's, even another driver's (docs/design.md: Ray internals)"
        )
        return None
    return job


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
    """While the block runs, each placement group of this driver's job made since it started that
    stays pending `after_s` is said in one line (wait_line), once."""
    import ray

    own = own_job_suffix()

    def mine(group: str) -> bool:
        return own is None or group.endswith(own)

    before = {group for group in ray.util.placement_group_table() if mine(group)}
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
                if group in before or group in said or not mine(group):
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
