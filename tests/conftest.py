"""Test tiers and shared fixtures.

Two tiers: `pytest` runs the unit tier, which starts no Ray (every test that does, by the
`ray_session` fixture or in a subprocess, is marked slow; the unit tier points Ray's temp folder
at a folder of its own and fails a test that starts a Ray instance there); `pytest --slow -m slow`
runs the Ray / end-to-end tier (`pytest --slow` runs both). Session fixtures: one local Ray
instance and one sqlite MLflow store (each once per process: scripts/test.sh runs two pytest-xdist
processes), the sample prepared once for the run."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ("testkit.scheduling",)

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """A real local Ray instance on this machine, started once (it takes seconds) and shut down at the end."""
    import ray

    from convsts.ray_jobs.runtime.ray_start import PREEMPTION_WATCHER_ENV

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # This one-node instance is never drained: as on a local instance that `convsts` starts
    # (runtime/ray_start.py), a run's drivers joined to it start no preemption-watcher actor. The
    # multi-node cluster tests keep Ray's default.
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
    from ray.data import DataContext

    # Worker processes import test modules by name (functions defined in tests are pickled by
    # reference), as pytest does: each from its own folder, testkit from tests/.
    folders = [REPO / "tests", *sorted(p for p in (REPO / "tests").iterdir() if p.is_dir() and p.name != "testkit")]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [*map(str, folders), os.environ.get("PYTHONPATH")]))}
    ray.init(num_cpus=2, include_dashboard=True, logging_level="WARNING", runtime_env={"env_vars": env})
    DataContext.get_current().enable_progress_bars = False
    yield ray
    _shutdown_whole(ray)


def _shutdown_whole(ray) -> None:
    """ray.shutdown(), then every process the instance had (its actors too, noted while their raylet
    is their parent: Ray renames them) gone within 15 s, or stopped with a warning naming them: one
    left asleep would hold its memory, and one left busy the CPUs of the tests that follow."""
    import warnings

    from ray._private.worker import _global_node
    from testkit.local_cluster import pids_matching, still_running, stop_pids

    from convsts.io.processes import start_time

    pids = pids_matching(_global_node.get_session_dir_path())  # without this process
    seen = {pid: started for pid in pids if (started := start_time(pid)) is not None}
    ray.shutdown()
    left = still_running(seen, seconds=15)
    if left:
        stop_pids([pid for pid, started in seen.items() if start_time(pid) == started], grace_s=2)
        warnings.warn(
            f"{len(left)} processes of the session's Ray instance outlived its shutdown, stopped: {left}", stacklevel=1
        )


@pytest.fixture(scope="session")
def sample_prepared(tmp_path_factory) -> Path:
    """The embedded sample prepared once for the whole run (Reddit and SNLI, the default filters;
    SAMPLE_PREPARE), for the tests that train on it without changing its data settings: both
    pytest-xdist processes use one folder, the first to come prepares it (in the driver, without
    Ray) and the other finds it prepared. Training only reads a prepared folder."""
    from filelock import FileLock
    from testkit.tiny import SAMPLE_PREPARE

    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.pipelines.inputs import prepare_all

    run_root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # basetemp is this process's folder in the run's
        run_root = run_root.parent
    out = run_root / "sample_prepared"
    with FileLock(str(run_root / "sample_prepared.lock")):
        prepare_all(load_config(None, SAMPLE_PREPARE), str(out))  # a folder already prepared is kept
    return out


@pytest.fixture
def sample_checkpoint(tmp_path) -> Path:
    """An untrained small DAN checkpoint on the sample STS-B vocabulary (testkit.checkpoints)."""
    from testkit.checkpoints import sample_dan_checkpoint

    return sample_dan_checkpoint(tmp_path / "ckpt")


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """A sqlite tracking store, created once: its first use runs the schema migrations, which take seconds."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    return uri


def pytest_addoption(parser):
    parser.addoption(
        "--slow", action="store_true", default=False, help="also run the slow tier (Ray, Ray Train / Tune jobs)"
    )
    parser.addoption(
        "--release",
        action="store_true",
        default=False,
        help="also run the release tier: long scenarios whose CI-size twins the slow tier runs (docs/testing.md)",
    )


def _slow_tier(config) -> bool:
    return config.getoption("--slow") or os.environ.get("CONVSTS_SLOW") == "1"


def pytest_configure(config):
    # Ray Train's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by
    # default; the driver passes it on to the controller): a checkpoint reported while the previous
    # one is still queued waits for the next poll, and a run's start and end wait for one each. The
    # tests' runs checkpoint every few steps, so they poll four times as often.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    if not _slow_tier(config):  # the unit tier: a Ray instance started anywhere below shows up here
        os.environ["RAY_TMPDIR"] = config.convsts_ray_tmp = tempfile.mkdtemp(prefix="convsts-unit-")


def pytest_unconfigure(config):
    if hasattr(config, "convsts_ray_tmp"):  # empty unless a test started Ray (and then failed for it)
        shutil.rmtree(config.convsts_ray_tmp, ignore_errors=True)


def _ray_sessions(config) -> set[str]:
    root = Path(getattr(config, "convsts_ray_tmp", "")) / "ray"
    return {p.name for p in root.glob("session_*")} if root.is_dir() else set()


@pytest.fixture(autouse=True)
def _unit_tier_starts_no_ray(request):
    """In the unit tier, a test that starts Ray (in this process or a subprocess) fails: mark it slow."""
    before = _ray_sessions(request.config)
    yield
    if hasattr(request.config, "convsts_ray_tmp") and _ray_sessions(request.config) - before:
        pytest.fail(f"{request.node.nodeid} started a Ray instance: the unit tier runs without Ray; mark it slow")


@pytest.fixture(autouse=True)
def _gpu_tests_need_cuda(request):
    """A test marked gpu is skipped where torch sees no CUDA device (torch is imported when such a
    test runs, not at collection)."""
    if request.node.get_closest_marker("gpu") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("gpu: torch sees no CUDA device here")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if {"ray_session", "sample_prepared"} & set(item.fixturenames):  # it starts Ray or trains: the slow tier
            item.add_marker(pytest.mark.slow)
    if not config.getoption("--release"):
        skip_release = pytest.mark.skip(reason="release: run with --release (scripts/test.sh --release does)")
        for item in items:
            if "release" in item.keywords:
                item.add_marker(skip_release)
    if _slow_tier(config):
        return
    skip = pytest.mark.skip(reason="slow: run with --slow (scripts/test.sh does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
