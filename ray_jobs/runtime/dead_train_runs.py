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
driver's Ray job in the cluster's key-value store (record_fit), and Ray's job list (the public state
API) says which drivers have ended. One line names each fit that still held resources. A request
already expired or cancelled is left as is, and a live driver's fit is never touched.

Ray has no public API for the coordinator or the key-value store: those parts use Ray internals,
named in docs/design.md for whoever upgrades Ray (the constants above, the coordinator's methods and
its requester id) and pinned by tests/training/test_dead_fit_release.py. A release that moves or
changes one makes this step say so in one warning line and the run go on without it (a group after
a killed driver may then wait for the dead fit's reservation to expire); it never stops a run.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from convsts.ray_jobs.runtime.logs import log

TIMEOUT_S = 5.0  # each call to the coordinator and the state API
STATE_LIMIT = 10_000  # the most rows Ray's state API gives in one answer (it refuses more)
KV_NAMESPACE, FIT_KEY_PREFIX = "convsts", "fit/"  # record_fit's records: fit/<Ray Train run id> -> driver's job id
COORDINATOR = ("AutoscalingCoordinator", "AutoscalingCoordinator")  # its actor name and namespace (Ray Data's)
EXPIRY_MODULE = "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client"
KV_MODULE = "ray.experimental.internal_kv"
KV_FUNCTIONS = ("_internal_kv_put", "_internal_kv_list", "_internal_kv_get", "_internal_kv_del")


class RayInternalsMissing(RuntimeError):
    """A Ray internal this module uses is gone or changed."""


def requester(ray_train_run: str) -> str:
    """The coordinator's name for a fit's request (Train V2's scaling policy)."""
    return f"train-{ray_train_run}"


def _cpus(reserved: dict[str, dict[str, float]]) -> float:
    """The CPUs of a reservation: {node id: resources}."""
    return sum(float(held.get("CPU", 0.0)) for held in reserved.values())


def _fit_key(ray_train_run: str) -> bytes:
    return f"{FIT_KEY_PREFIX}{ray_train_run}".encode()


def _internal(module: str, name: str) -> Any:
    """One Ray internal, or RayInternalsMissing naming it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise RayInternalsMissing(f"{module}.{name} ({type(err).__name__}: {err})") from err


def _kv(name: str) -> Any:
    return _internal(KV_MODULE, name)


def _expiry() -> str:
    """Ray's expiry of a fit's request, as the release line says it."""
    try:
        return f"up to {int(_internal(EXPIRY_MODULE, 'AUTOSCALING_REQUESTS_EXPIRE_TIME_S'))} s"
    except (RayInternalsMissing, TypeError, ValueError):
        return "until the request expired"


def record_fit(ray_train_run: str) -> None:
    """Record on the cluster that this driver's Ray job runs the fit `ray_train_run` (before it
    starts). Without the internals it records nothing: release_dead_fits has said so already."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    try:
        _kv("_internal_kv_put")(_fit_key(ray_train_run), job.encode(), namespace=KV_NAMESPACE)
    except RayInternalsMissing as err:
        log.debug("this fit is not recorded for a later run to release: %s", err)


def ended_jobs() -> set[str] | None:
    """The ids of the Ray jobs whose driver has ended, from Ray's public state API; None where it
    does not answer (a cluster without the dashboard)."""
    from ray.util.state import list_jobs

    try:
        jobs = list_jobs(limit=STATE_LIMIT, timeout=int(TIMEOUT_S), raise_on_missing_output=False)
    except Exception as err:  # no dashboard, or it did not answer: other runs' fits are left to expire
        log.debug("Ray's job list did not answer (%s): other runs' dead fits are not released", err)
        return None
    ended = set()
    for job in jobs:
        status = str(getattr(job.status, "value", job.status))
        if job.job_id and status in {"SUCCEEDED", "FAILED", "STOPPED"}:
            ended.add(job.job_id)
    return ended


def orphaned_fits() -> list[str]:
    """The Ray Train run ids of the fits record_fit recorded on this cluster whose driver's job has
    ended (killed, or its machine lost); their records are removed as they are found."""
    kv_list, get, delete = (_kv(name) for name in KV_FUNCTIONS[1:])
    keys = kv_list(FIT_KEY_PREFIX.encode(), namespace=KV_NAMESPACE)
    if not keys:
        return []
    ended = ended_jobs()
    if not ended:
        return []
    found = []
    for key in keys:
        job = get(key, namespace=KV_NAMESPACE)
        if job is not None and job.decode() in ended:
            found.append(key.decode()[len(FIT_KEY_PREFIX) :])
            delete(key, namespace=KV_NAMESPACE)
    return found


def release_dead_fits(ray_train_runs: Iterable[str | None]) -> list[str]:
    """Cancel the coordinator's requests of `ray_train_runs` (this OUT's earlier fits, whose driver
    is gone; None: a run that recorded none) and of every other convsts fit whose driver has died;
    the ids of those that still held resources, each said in one line. Where a Ray internal it uses
    is gone or changed, one warning line, and the run goes on."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        return _release(list(ray_train_runs))
    except (GetTimeoutError, RayActorError) as err:
        log.warning(
            "could not release the cluster reservations of dead fits: Ray's autoscaling coordinator did not "
            "answer (%s). The run goes on; after a killed driver its workers may wait until Ray lets that "
            "fit's reservation expire",
            type(err).__name__,
        )
        return []
    except (RayInternalsMissing, AttributeError, TypeError) as err:
        log.warning(
            "could not release the cluster reservations of dead fits: a Ray internal this step uses is "
            "missing or changed in Ray %s: %s. The run goes on; after a killed driver its workers may wait "
            "until Ray lets that fit's reservation expire (docs/design.md names these internals)",
            ray.__version__,
            err,
        )
        return []


def _release(ray_train_runs: list[str | None]) -> list[str]:
    import ray

    for name in KV_FUNCTIONS:  # every run checks them, so a changed Ray shows on its first run
        _kv(name)
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
                "Ray would have kept it %s",
                whose,
                run,
                _cpus(held),
                _expiry(),
            )
    return released
