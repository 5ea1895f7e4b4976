"""Runs on the multi-node cluster (conftest.py): workers spread over nodes, each run owns its
checkpoints in the bucket, and a submitted job that loses a node goes on from a checkpoint with
the losses and weights of an undisturbed run."""

from __future__ import annotations

import json

import pytest
import torch
from testkit.multinode import BUCKET, CLI, EVERY, KILLABLE, PASSWORD, STEPS, history, run_losing_a_node, train_args
from testkit.s3_server import keys

pytestmark = pytest.mark.slow


def test_runs_on_a_cluster_spread_own_their_checkpoints_and_survive_a_lost_node(
    one_cpu_nodes, undisturbed, sample_prepared, tmp_path
):
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file

    cluster, info = one_cpu_nodes, undisturbed
    client = MlflowClient(cluster.mlflow)
    assert info["storage"].startswith(f"{BUCKET}/ray_results/shared/")
    assert json.loads((info["out"] / "checkpoint" / "config.json").read_text())["step"] == STEPS
    # MLflow's own "View run ... at: URL" lines (the driver's and the workers') and every other line
    # leave the tracking URI's credentials out; the run was tracked with them.
    assert PASSWORD not in info["log"] and "alice" not in info["log"]
    # SPREAD (the default placement): the two task workers ran on two distinct nodes.
    assert len(info["worker_nodes"]) == 2 and len(set(info["worker_nodes"])) == 2, info["worker_nodes"]
    # Checkpoints in the bucket, under the run's own folder.
    first_keys = set(keys(info["storage"]))
    assert any("/checkpoint-" in k and k.endswith("model.safetensors") for k in first_keys), sorted(first_keys)[:5]

    # A second run with the same name and storage path, submitted as a job to the head's dashboard
    # (its driver runs on the head), trains from step 0 in a folder of its own and leaves the first
    # run's files as they were. Past a checkpoint it loses a worker node; a replacement node joins,
    # the run goes on from there and the job SUCCEEDS.
    submit = ["submit", "--address", cluster.dashboard, "--submission-id", "convsts-cluster-train"]
    log = run_losing_a_node(
        cluster,
        CLI + submit + train_args(tmp_path / "b", sample_prepared, *KILLABLE, f"mlflow.tracking_uri={cluster.mlflow}"),
    )
    assert "job convsts-cluster-train: SUCCEEDED" in log and "start step 0" in log, log[-3000:]
    again = json.loads((tmp_path / "b" / "train.json").read_text())
    assert again["storage"] != info["storage"] and again["storage"].startswith(f"{BUCKET}/ray_results/shared/")
    assert set(keys(info["storage"])) == first_keys
    assert json.loads((tmp_path / "b" / "checkpoint" / "config.json").read_text())["step"] == STEPS
    run = client.get_run(again["mlflow_run_id"])
    assert run.data.tags["convsts.storage"] == again["storage"] and run.info.status == "FINISHED"
    # Restarted once, at a checkpoint, and said so.
    restarts = [int(m.value) for m in client.get_metric_history(again["mlflow_run_id"], "train/restarted_at_step")]
    starts = "\n".join(line for line in log.splitlines() if "start step" in line)
    assert len(restarts) == 1 and restarts[0] >= EVERY and restarts[0] % EVERY == 0, (restarts, starts)
    assert f"start step {restarts[0]}" in log
    # Each step's metrics once, and the same losses and weights as the undisturbed run, read from a
    # folder of many shards (the trainer's feed keeps one order whatever the read tasks' timing).
    assert len(list((sample_prepared / "reddit" / "train").glob("*.parquet"))) >= 8
    assert len(list((sample_prepared / "snli" / "train").glob("*.parquet"))) >= 8
    for name in ("reddit/loss", "snli/loss", "lr"):
        assert history(client, again["mlflow_run_id"], name) == history(client, info["mlflow_run_id"], name), name
    weights = [load_file(str(run / "checkpoint" / "model.safetensors")) for run in (info["out"], tmp_path / "b")]
    assert weights[0].keys() == weights[1].keys()
    assert [k for k in weights[0] if not torch.equal(weights[0][k], weights[1][k])] == []
