"""Ray for an entry point: attach to a cluster (RAY_ADDRESS) or start a local instance, with the settings every driver and worker of ours takes (worker_setup, Ray Data's defaults)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from convsts.ray_jobs.runtime.entry import SigtermAsInterrupt
from convsts.ray_jobs.runtime.logs import quiet_ray_logs, verbose
from convsts.ray_jobs.runtime.reaper import start_reaper


def worker_setup() -> None:
    """Ray's `worker_process_setup_hook` in every worker of an instance that convsts starts or joins:
    RAY_ADDRESS set to the worker's own cluster, so that Ray's helpers which look a cluster up by
    address (Train's placement-group cleaner polls the state API) find this one even when other Ray
    instances run on the machine (without it they print a "Found multiple active Ray instances"
    traceback); then ray_data_defaults and quiet_ray_logs."""
    import ray

    os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    ray_data_defaults()
    quiet_ray_logs()


# Ray Data (2.60) lists a parquet folder with a pool of footer-reading actors, 32 by default, each
# its own Python process started for one listing and killed after it; one actor reads 128 footers
# at once. A prepared folder holds tens to thousands of shards: those processes cost a small run
# more CPU than its training (a 4-step run: 65 CPU-seconds with 32, about 52 with 1, on 2 cores).
FOOTER_ACTORS_ENV, FOOTER_ACTORS = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1"


def ray_data_defaults() -> None:
    """Ray Data settings read from the environment where a dataset is planned (the driver, a Tune
    trial's process): a user's own value stays."""
    os.environ.setdefault(FOOTER_ACTORS_ENV, FOOTER_ACTORS)


LOCAL_STARTUP_CONCURRENCY = 4  # Python workers a local Ray instance starts at once, at the least


PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # Ray Train's switch (ray.train.v2 constants)


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Attach to the cluster at `address`/RAY_ADDRESS, or start a local instance on this machine."""

    import ray

    quiet_ray_logs()
    ray_data_defaults()
    if not verbose():  # the project's own progress lines only; Ray Data's bars redraw with escape codes
        from ray.data import DataContext

        context = DataContext.get_current()  # travels with each dataset to the workers that run it
        context.enable_progress_bars = False
        context.print_on_execution_start = False
    if ray.is_initialized():
        return
    if not (sys.stdout.isatty() and sys.stderr.isatty()):  # a log file, a pipe or a job's log, not a terminal:
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # worker lines without colour codes (a user's own setting wins)
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {"logging_level": logging.INFO if verbose() else logging.WARNING, "log_to_driver": True}
    # A submitted job whose own runtime env names a setup hook keeps it (Ray refuses two).
    if "worker_process_setup_hook" not in os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", ""):
        kwargs["runtime_env"] = {"worker_process_setup_hook": f"{__name__}.worker_setup"}
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        _init_ray(ray, address, num_cpus, kwargs)
    finally:
        # Ray's core installs its own SIGTERM handler, which prints a native stack and exits: a
        # command's SIGTERM (`convsts jobs stop`, `kill`, a scheduler) unwinds as Ctrl+C again.
        if isinstance(sigterm, SigtermAsInterrupt) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)


def _init_ray(ray, address: str | None, num_cpus: int | None, kwargs: dict[str, Any]) -> None:
    """ray.init: joined to `address`, or a local instance."""
    if address:
        ray.init(address=address, **kwargs)
    else:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # The dashboard serves the state API that Train V2's placement-group cleaner polls; it and
        # the job API listen on 127.0.0.1 only. Ray 2.60's own gRPC servers (GCS, raylet, workers)
        # cannot be bound to loopback: they listen on all interfaces and Ray replaces a 127.0.0.1
        # node address with the machine's (ray/_private/services.py, resolve_ip_for_localhost);
        # later Ray releases bind them to the node IP (ray-project/ray#59852). docs/reliability.md.
        # The raylet warns once it has started 4x its worker start-up concurrency (the CPU count) of
        # Python workers; a training run starts about 8 (Train's controller and workers, Ray Data's
        # tasks and actors), which on a 2-CPU machine printed that warning on every run. At least
        # LOCAL_STARTUP_CONCURRENCY concurrent starts keep it for a real excess of workers.
        cpus = num_cpus or os.cpu_count() or 1
        # A local instance's one node is never drained or preempted, so Ray Train's preemption
        # watcher (an actor per run) has nothing to watch; without it the run also loses the
        # `core_worker.cc` line about the watcher's constructor arguments (ray-project/ray#53727).
        # Read by Train's controller, which gets it from this process's environment; a user's own value stays.
        os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
        ray.init(
            num_cpus=num_cpus,
            dashboard_host="127.0.0.1",
            _system_config={"worker_maximum_startup_concurrency": max(LOCAL_STARTUP_CONCURRENCY, cpus)},
            **kwargs,
        )
        from ray._private.worker import _global_node

        if _global_node is not None:  # no process of the instance outlives this command
            start_reaper(_global_node.get_session_dir_path())
