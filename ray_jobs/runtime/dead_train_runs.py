"""The cluster reservations of earlier fits whose driver is gone, released.

Every Ray Train fit (Train V2, fixed-size and elastic) asks Ray Data's cluster-wide
`AutoscalingCoordinator` actor to reserve its workers' resources, as `train-<Ray Train run id>`, and
renews the request every 20 s; its controller cancels it when the fit ends. A driver killed with
SIGKILL (or a lost driver machine) takes its controller with it and nothing cancels the request:
Ray lets it expire after `AUTOSCALING_REQUESTS_EXPIRE_TIME_S` (180 s). Meanwhile the coordinator
keeps those resources for the dead fit, so a group started then is sized without them: a run after
a killed driver would wait minutes in silence before its first step.

Before its own fit a run cancels the requests of two kinds of dead fits: its OUT's chain's (run.json
records each one's Ray Train run id, and none of them runs: this run holds OUT's lock), and any
other convsts fit on the cluster whose driver is gone: each fit records its Ray Train run id and its
driver's Ray job in the cluster's key-value store (record_fit), and Ray's job table says which
drivers have died. One line names each fit that still held resources. A request already expired or
cancelled is left as is, and a live driver's fit is never touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from convsts.ray_jobs.runtime.logs import log

TIMEOUT_S = 5.0  # each call to the coordinator
KV_NAMESPACE, FIT_KEY_PREFIX = "convsts", "fit/"  # record_fit's records: fit/<Ray Train run id> -> driver's job id
COORDINATOR = ("AutoscalingCoordinator", "AutoscalingCoordinator")  # its actor name and namespace (Ray Data's)


def requester(ray_train_run: str) -> str:
    """The coordinator's name for a fit's request (Train V2's scaling policy)."""
    return f"train-{ray_train_run}"


def _cpus(reserved: dict[str, dict[str, float]]) -> float:
    """The CPUs of a reservation: {node id: resources}."""
    return sum(float(held.get("CPU", 0.0)) for held in reserved.values())


def _fit_key(ray_train_run: str) -> bytes:
    return f"{FIT_KEY_PREFIX}{ray_train_run}".encode()


def record_fit(ray_train_run: str) -> None:
    """Record on the cluster that this driver's Ray job runs the fit `ray_train_run` (before it starts)."""
    import ray
    from ray.experimental import internal_kv

    job = ray.get_runtime_context().get_job_id()
    internal_kv._internal_kv_put(_fit_key(ray_train_run), job.encode(), namespace=KV_NAMESPACE)


def orphaned_fits() -> list[str]:
    """The Ray Train run ids of the fits record_fit recorded on this cluster whose driver's job has
    died (killed, or its machine lost); their records are removed as they are found."""
    import ray._private.state as ray_state
    from ray.experimental import internal_kv

    keys = internal_kv._internal_kv_list(FIT_KEY_PREFIX.encode(), namespace=KV_NAMESPACE)
    if not keys:
        return []
    dead_jobs = {job["JobID"] for job in ray_state.jobs() if job["IsDead"]}
    found = []
    for key in keys:
        job = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if job is not None and job.decode() in dead_jobs:
            found.append(key.decode()[len(FIT_KEY_PREFIX) :])
            internal_kv._internal_kv_del(key, namespace=KV_NAMESPACE)
    return found


def release_dead_fits(ray_train_runs: Iterable[str | None]) -> list[str]:
    """Cancel the coordinator's requests of `ray_train_runs` (this OUT's earlier fits, whose driver
    is gone; None: a run that recorded none) and of every other convsts fit whose driver has died;
    the ids of those that still held resources, each said in one line."""
    import ray
    from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
        AUTOSCALING_REQUESTS_EXPIRE_TIME_S,
    )

    try:
        coordinator = ray.get_actor(COORDINATOR[0], namespace=COORDINATOR[1])
    except ValueError:  # no fit has run on this cluster since it started: nothing is held
        return []
    own = [r for r in ray_train_runs if r]
    others = [run for run in orphaned_fits() if run not in own]
    released: list[str] = []
    for run in [*own, *others]:
        # {node id: resources}, {} where the coordinator holds no request of that fit
        held: Any = ray.get(coordinator.get_reserved_resources.remote(requester(run)), timeout=TIMEOUT_S)
        ray.get(coordinator.cancel_request.remote(requester_id=requester(run)), timeout=TIMEOUT_S)
        if held:
            released.append(run)
            whose = "an earlier fit of this OUT" if run in own else "another run's fit"
            log.info(
                "released the cluster reservation of %s, Ray Train run %s (%g CPU), whose driver is gone: "
                "Ray would have kept it for up to %d s",
                whose,
                run,
                _cpus(held),
                AUTOSCALING_REQUESTS_EXPIRE_TIME_S,
            )
    return released
