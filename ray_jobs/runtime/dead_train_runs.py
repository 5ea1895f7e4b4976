"""The cluster reservations of earlier fits whose driver is gone, released.

Every Ray Train fit (Train V2, fixed-size and elastic) asks Ray Data's cluster-wide
`AutoscalingCoordinator` actor to reserve its workers' resources, as `train-<Ray Train run id>`, and
renews the request every 20 s; its controller cancels it when the fit ends. A driver killed with
SIGKILL (or a lost driver machine) takes its controller with it and nothing cancels the request:
Ray lets it expire after `AUTOSCALING_REQUESTS_EXPIRE_TIME_S` (180 s). Meanwhile the coordinator
keeps those resources for the dead fit, so an elastic group started then is sized without them: a
`--resume latest` after a killed driver would wait minutes in silence before its first step.

A run knows the fits of its OUT's chain (run.json records each one's Ray Train run id), and that
none of them is running: it holds OUT's lock. Before its own fit it cancels their requests; one
line names each that still held resources. A request already expired or cancelled is left as is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from convsts.ray_jobs.runtime.logs import log

TIMEOUT_S = 5.0  # each call to the coordinator
COORDINATOR = ("AutoscalingCoordinator", "AutoscalingCoordinator")  # its actor name and namespace (Ray Data's)


def requester(ray_train_run: str) -> str:
    """The coordinator's name for a fit's request (Train V2's scaling policy)."""
    return f"train-{ray_train_run}"


def _cpus(reserved: dict[str, dict[str, float]]) -> float:
    """The CPUs of a reservation: {node id: resources}."""
    return sum(float(held.get("CPU", 0.0)) for held in reserved.values())


def release_dead_fits(ray_train_runs: Iterable[str | None]) -> list[str]:
    """Cancel the coordinator's requests of `ray_train_runs`, fits whose driver is gone (None: a run
    that recorded none); the ids of those that still held resources, each said in one line."""
    import ray
    from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
        AUTOSCALING_REQUESTS_EXPIRE_TIME_S,
    )

    runs = [r for r in ray_train_runs if r]
    if not runs:
        return []
    try:
        coordinator = ray.get_actor(COORDINATOR[0], namespace=COORDINATOR[1])
    except ValueError:  # no fit has run on this cluster since it started: nothing is held
        return []
    released: list[str] = []
    for run in runs:
        # {node id: resources}, {} where the coordinator holds no request of that fit
        held: Any = ray.get(coordinator.get_reserved_resources.remote(requester(run)), timeout=TIMEOUT_S)
        ray.get(coordinator.cancel_request.remote(requester_id=requester(run)), timeout=TIMEOUT_S)
        if held:
            released.append(run)
            log.info(
                "released the cluster reservation of an earlier fit of this OUT, Ray Train run %s (%g CPU), "
                "whose driver is gone: Ray would have kept it for up to %d s",
                run,
                _cpus(held),
                AUTOSCALING_REQUESTS_EXPIRE_TIME_S,
            )
    return released
