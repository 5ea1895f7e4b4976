"""The dead-fit release (runtime/dead_train_runs.py) against the locked Ray: the internals it names
are there and do what it relies on; made unavailable, `convsts train` says so in one warning line
and trains. The release of a real killed fit: tests/training/test_run_chain_resume.py (another
OUT's) and tests/cluster/multinode/test_lost_node.py (the same OUT's)."""

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit.tiny import TINY_TRAIN

from convsts.ray_jobs.runtime import dead_train_runs as dead

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_internals_it_names_release_a_held_request_once_in_one_line(ray_session, caplog):
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    for name in dead.KV_FUNCTIONS:
        assert callable(dead._kv(name)), name
    assert dead._expiry() == "up to 180 s"
    # Ray's own constructor of the coordinator gives the actor the name and namespace the release looks up.
    coordinator = get_or_create_autoscaling_coordinator()
    assert ray_session.get_actor(*dead.COORDINATOR)._actor_id == coordinator._actor_id
    run = f"pinned-{os.getpid()}"
    ray_session.get(coordinator.request_resources.remote(dead.requester(run), [{"CPU": 1}], 60))
    deadline = time.time() + 30
    while not ray_session.get(coordinator.get_reserved_resources.remote(dead.requester(run), recompute=True)):
        assert time.time() < deadline, "the coordinator reserved nothing for the request"
        time.sleep(0.2)
    with caplog.at_level(logging.INFO, logger="convsts"):
        assert dead.release_dead_fits([run, None]) == [run]
        assert dead.release_dead_fits([run]) == []  # cancelled: nothing is held the second time
    lines = [r.getMessage() for r in caplog.records if r.name == "convsts"]
    assert lines == [
        f"released the cluster reservation of an earlier fit of this OUT, Ray Train run {run} (1 CPU), "
        "whose driver is gone: Ray would have kept it up to 180 s"
    ], lines
    assert ray_session.get(coordinator.get_reserved_resources.remote(dead.requester(run))) == {}


# `python -m convsts` with the release's Ray internals gone, as a Ray release that moved them would
# leave them: Ray's and the command's own modules imported first (Ray imports the key-value store
# itself, and keeps what it holds), then the internals named missing to any later import.
WITHOUT_INTERNALS = f"""
import importlib, runpy, sys
import ray.autoscaler.v2.utils, ray.data, ray.train.torch, ray.train.v2.api.data_parallel_trainer
import convsts.ray_jobs.cli.train, convsts.ray_jobs.training.driver, convsts.ray_jobs.training.ray_trainer
for name in ({dead.KV_MODULE!r}, {dead.EXPIRY_MODULE!r}):
    importlib.import_module(name)
    sys.modules[name] = None
sys.argv = ["convsts", *sys.argv[1:]]
runpy.run_module("convsts", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_run_without_the_internals_says_so_in_one_warning_line_and_trains(
    ray_session, sample_prepared, mlflow_uri, tmp_path
):
    out = tmp_path / "out"
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_INTERNALS, "train", "--out", str(out), "--prepared", str(sample_prepared),
         *TINY_TRAIN, "trainer.num_workers=1", f"mlflow.tracking_uri={mlflow_uri}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "could not release the cluster reservations" in line]
    assert len(warned) == 1 and "WARNING" in warned[0], done.stderr[-3000:]
    assert f"{dead.KV_MODULE}._internal_kv_put" in warned[0] and "The run goes on" in warned[0], warned
    assert json.loads((out / "checkpoint" / "config.json").read_text())["step"] == 4
