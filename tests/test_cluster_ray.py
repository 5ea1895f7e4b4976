"""Runs on a real multi-node Ray cluster on this host: a head and two worker nodes, each its own
`ray start` raylet with its own temp dir and ports; checkpoints in an S3 bucket (the local S3
server), metrics in an MLflow server on 127.0.0.1. The drivers are `convsts` commands joined to the
cluster through RAY_ADDRESS, as on a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from local_cluster import mlflow_server, ray_head, ray_worker_node
from s3_server import keys, s3_endpoint
from tiny import TINY_TRAIN

REPO = Path(__file__).resolve().parent.parent
BUCKET = "s3://convsts-cluster"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """{"env": a driver's environment joined to the cluster, "dashboard": ..., "mlflow": ...}."""
    root = tmp_path_factory.mktemp("cluster")
    with s3_endpoint(BUCKET[len("s3://") :]) as s3_env, mlflow_server(root / "mlflow") as mlflow_url:
        env = {**s3_env, "RAY_AUTH_MODE": "disabled"}
        with ray_head(env, num_cpus=1) as head:
            with ray_worker_node(head["gcs"], env), ray_worker_node(head["gcs"], env):
                driver = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_TRACKING"))}
                driver.update(env, RAY_ADDRESS=head["gcs"], MLFLOW_TRACKING_URI=mlflow_url, RAY_USAGE_STATS_ENABLED="0")
                yield {"env": driver, "dashboard": head["address"], "mlflow": mlflow_url}


def _train(cluster, out: Path, prepared: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "convsts.ray_jobs.cli", "train", "--out", str(out), "--prepared", str(prepared),
         *TINY_TRAIN, "name=shared", f"trainer.storage_path={BUCKET}/ray_results", *overrides],
        cwd=REPO, env=cluster["env"], capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_runs_on_a_cluster_spread_their_workers_and_own_their_checkpoints(cluster, sample_prepared, tmp_path):
    from ray.util.state import list_actors

    first = _train(cluster, tmp_path / "a", sample_prepared)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    info = json.loads((tmp_path / "a" / "train.json").read_text())
    assert info["storage"].startswith(f"{BUCKET}/ray_results/shared/")
    assert json.loads((tmp_path / "a" / "checkpoint" / "config.json").read_text())["step"] == 4
    # SPREAD (the default placement): the two task workers ran on two distinct nodes.
    workers = list_actors(address=cluster["dashboard"], filters=[("class_name", "=", "RayTrainWorker")], limit=1000)
    assert len({w.node_id for w in workers}) == 2, workers
    # Checkpoints in the bucket, under the run's own folder.
    first_keys = set(keys(info["storage"]))
    assert any("/checkpoint_" in k and k.endswith("model.safetensors") for k in first_keys), sorted(first_keys)[:5]

    # A second run with the same name and storage path trains from step 0 in a folder of its own and
    # leaves the first run's files as they were (before: it restored them and trained 0 steps).
    second = _train(cluster, tmp_path / "b", sample_prepared)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "start step 0" in second.stdout + second.stderr
    again = json.loads((tmp_path / "b" / "train.json").read_text())
    assert again["storage"] != info["storage"] and again["storage"].startswith(f"{BUCKET}/ray_results/shared/")
    assert set(keys(info["storage"])) == first_keys
    assert json.loads((tmp_path / "b" / "checkpoint" / "config.json").read_text())["step"] == 4
    # The run's storage is on its MLflow run.
    from mlflow.tracking import MlflowClient

    run = MlflowClient(cluster["mlflow"]).get_run(again["mlflow_run_id"])
    assert run.data.tags["convsts.storage"] == again["storage"] and run.info.status == "FINISHED"


def test_a_layout_that_fits_no_node_is_refused_before_any_work(cluster, sample_prepared, tmp_path):
    # 1.5 CPUs per worker: the cluster has 3 CPUs in all but no node with more than 1.
    refused = _train(cluster, tmp_path / "c", sample_prepared, "trainer.cpus_per_worker=1.5")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert "do not fit on the cluster's 3 node(s): 1 CPU, 1 CPU, 1 CPU" in line and "trainer.cpus_per_worker" in line
    assert not (tmp_path / "c" / "train.json").exists()
