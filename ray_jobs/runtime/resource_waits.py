"""A fit whose worker group waits for resources says so, in one line, instead of waiting in silence.

Ray Train places a worker group as one placement group and waits up to
`RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S` (60 s by default) for it: after a lost node its view of the
node lags, a killed run's reservation may still stand, a cluster may be too busy. Meanwhile nothing
of the run moves and nothing says why. `saying_resource_waits` watches the cluster's placement
groups while a fit runs; one of its own (made since the fit started, by this driver's Ray job: Ray
Train's controller and the trials of a sweep belong to it) that stays pending `after_s` is said once:
what it asks for, how long it has waited, and how long Ray Train gives it before it tries again.
Another driver's groups on the same cluster are never said: which job made a group comes from Ray's
state API, and where that does not answer (a cluster without the dashboard) nothing is said."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from convsts.ray_jobs.runtime.dead_train_runs import STATE_LIMIT

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


def own_groups(job_id: str) -> set[str] | None:
    """The ids of the placement groups that the Ray job `job_id` made; None where Ray's state API
    does not answer."""
    from ray.util.state import list_placement_groups

    try:
        groups = list_placement_groups(
            filters=[("creator_job_id", "=", job_id)], limit=STATE_LIMIT, timeout=5, raise_on_missing_output=False
        )
    except Exception as err:  # noqa: BLE001 - no dashboard, or it did not answer
        log.debug("Ray's state API did not say which placement groups are this run's (%s)", err)
        return None
    return {group.placement_group_id for group in groups}


@contextlib.contextmanager
def saying_resource_waits(after_s: float = AFTER_S, poll_s: float = POLL_S) -> Iterator[None]:
    """While the block runs, each placement group this driver's job made since it started that stays
    pending `after_s` is said in one line (wait_line), once."""
    import ray

    before = set(ray.util.placement_group_table())
    job_id = ray.get_runtime_context().get_job_id()
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
                    owned = own_groups(job_id)
                    if owned is None:  # the state API did not answer: asked again at the next poll
                        continue
                    said.add(group)  # decided once: another job's stays unsaid
                    if group in owned:
                        log.warning("%s", wait_line(info, now - since))

    thread = threading.Thread(target=watch, daemon=True, name="convsts-resource-waits")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2 * poll_s)
