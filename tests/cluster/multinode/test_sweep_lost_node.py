"""A sweep on the multi-node cluster (conftest.py) retries the trial whose node is lost from the
trial's own checkpoint in the bucket."""

from __future__ import annotations

import json

import pytest
from testkit.multinode import BUCKET, CLI, EVERY, KILLABLE, PASSWORD, STEPS, history, run_losing_a_node

pytestmark = pytest.mark.slow


def test_a_sweep_retries_the_trial_whose_node_is_lost_from_its_own_checkpoint(
    one_cpu_nodes, undisturbed, sample_prepared, tmp_path
):
    """An SNLI-fraction sweep (`convsts tune`) of one trial with a bucket storage path: a worker node
    of the running trial is lost; its training does not retry itself (trainer.max_failures=0), so the
    trial fails and Tune retries it (--max-failures) from the trial's own last checkpoint in the
    bucket. One trial is enough here: that each trial of a sweep trains in a folder of its own, and a
    curve of several fractions, are the local SNLI-fraction sweep's (tests/sweeps/test_sweep_resume.py)."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    cluster, out = one_cpu_nodes, tmp_path / "sweep"
    command = [*CLI, "tune", "--space", "snli_fraction", "--out", str(out),
               "--reddit-checkpoint", str(undisturbed["out"] / "checkpoint"), "--prepared", str(sample_prepared),
               "--param", "data.snli_fraction=[1.0]", "--param", "seed=[0]", "--max-failures", "2", "name=sweep",
               f"trainer.storage_path={BUCKET}/sweeps", *KILLABLE, "trainer.max_failures=0",
               "mlflow.experiment=cluster-sweep"]  # fmt: skip
    log = run_losing_a_node(cluster, command, experiment="cluster-sweep")
    assert PASSWORD not in log and "alice" not in log
    results = json.loads((out / "results.json").read_text())
    assert results["trials"] == 1 and results["failed_trials"] == [], results
    curve = pd.read_csv(out / "curve.csv")
    assert list(curve["fraction"]) == [1.0] and curve["stsb/dev/pearson"].between(-1, 1).all(), curve

    client = MlflowClient(cluster.mlflow)
    experiment = client.get_experiment_by_name("cluster-sweep").experiment_id
    children = [r for r in client.search_runs([experiment]) if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 1 and children[0].info.status == "FINISHED", children
    storage = children[0].data.tags["convsts.storage"]
    assert storage.startswith(f"{BUCKET}/sweeps/sweep/"), storage
    retried = []
    for run in children:
        losses = history(client, run.info.run_id, "reddit/loss")  # each step once
        assert min(losses) < EVERY and max(losses) == STEPS, (run.info.run_id, min(losses), max(losses))
        retried += [int(m.value) for m in client.get_metric_history(run.info.run_id, "train/restarted_at_step")]
    # The lost trial went on from its own checkpoint, not from step 0.
    assert len(retried) == 1 and retried[0] >= EVERY and retried[0] % EVERY == 0, (retried, log[-3000:])
