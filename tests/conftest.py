"""Shared fixtures: one local Ray instance and one sqlite MLflow store per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """A real local Ray instance on this machine, started once (5-10 s) and shut down at the end."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.data import DataContext

    # Worker processes import test modules by name (functions defined in tests are pickled by reference).
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))}
    ray.init(num_cpus=2, include_dashboard=True, logging_level="WARNING", runtime_env={"env_vars": env})
    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def sample_prepared(ray_session, tmp_path_factory) -> Path:
    """The embedded sample prepared once (Reddit and SNLI, the default filters) for the tests that
    train on it without changing its data settings: each `prepare` of it takes 25-35 s here.
    Training only reads a prepared folder."""
    from convsts.ray_jobs.config import load_config
    from convsts.ray_jobs.training.run import prepare_all

    out = tmp_path_factory.mktemp("sample_prepared")
    prepare_all(load_config(None), str(out))
    return out


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """A sqlite tracking store, created once: its first use runs the schema migrations (5-15 s)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    return uri


def pytest_addoption(parser):
    parser.addoption(
        "--slow", action="store_true", default=False, help="also run the slow end-to-end tests (Ray Train / Tune jobs)"
    )


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        no_gpu = pytest.mark.skip(reason="gpu: torch sees no CUDA device here")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(no_gpu)
    if config.getoption("--slow") or os.environ.get("CONVSTS_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --slow (scripts/test.sh does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
