"""A run on the multi-node cluster (conftest.py) that loses a node and then its driver: its workers
spread over nodes, it owns its checkpoints in the bucket, it goes on from a registered checkpoint
when a node is lost, and after its driver is SIGKILLed the same command is refused naming the newest
complete checkpoint, which `--resume latest` continues; along the two runs, every step is logged
once, with the losses and the final weights of the undisturbed run, bit for bit."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time

import pytest
import torch
from testkit.local_cluster import node_processes
from testkit.multinode import (
    BUCKET,
    CLI,
    EVERY,
    KILLABLE,
    PASSWORD,
    REPO,
    STEPS,
    history,
    lose_a_training_node,
    train,
    train_args,
    training_hosts,
)
from testkit.s3_server import keys

pytestmark = pytest.mark.slow

NAMED = ("mlflow.experiment=cluster-kill",)  # the undisturbed run's name and storage path, an experiment of its own


def _complete_checkpoints(folder_uri: str) -> list[str]:
    """The checkpoint folders under a bucket prefix whose manifest (written last) is there, oldest step first."""
    folders = [k.rsplit("/", 1)[0] for k in keys(folder_uri) if k.endswith("/manifest.json")]
    return sorted(folders, key=lambda f: int(f.rsplit("-", 1)[1]))


def _feed_processes(cluster) -> list:
    """The processes the training workers spawned to read their feed (trainer.feed_processes)."""
    import psutil

    found = []
    for node in cluster.nodes:
        for pid in node_processes(node, b"ray::RayTrainWorker"):
            with contextlib.suppress(psutil.Error):
                found += [c for c in psutil.Process(pid).children() if "multiprocessing.spawn" in " ".join(c.cmdline())]
    return found


def _step(folder: str) -> int:
    return int(folder.rsplit("-", 1)[1])


def test_a_run_that_loses_a_node_then_its_driver_goes_on_with_the_undisturbed_runs_losses_and_weights(
    one_cpu_nodes, undisturbed, sample_prepared, tmp_path
):
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file

    from convsts.io import storage

    cluster, info = one_cpu_nodes, undisturbed
    client = MlflowClient(cluster.mlflow)
    assert info["storage"].startswith(f"{BUCKET}/ray_results/shared/")
    assert json.loads((info["out"] / "checkpoint" / "config.json").read_text())["step"] == STEPS
    # MLflow's own "View run ... at: URL" lines (the driver's and the workers') and every other line
    # leave the tracking URI's credentials out; the run was tracked with them.
    assert PASSWORD not in info["log"] and "alice" not in info["log"]
    # SPREAD (the default placement): the two task workers ran on two distinct nodes.
    assert len(info["worker_nodes"]) == 2 and len(set(info["worker_nodes"])) == 2, info["worker_nodes"]
    first_keys = set(keys(info["storage"]))
    assert any("/checkpoint-" in k and k.endswith("model.safetensors") for k in first_keys), sorted(first_keys)[:5]

    # A second run with the same name and storage path trains from step 0 in a folder of its own.
    # Past a registered checkpoint it loses a worker node that hosts a task worker; a replacement
    # node joins and the group goes on from that checkpoint. Once it has completed a checkpoint
    # after its restart, its driver is SIGKILLed (a killed job, a closed laptop, an OOM on the head).
    # Its workers read in a feed process each (trainer.feed_processes=1): none of those may outlive
    # the SIGKILL either (same batches: the losses stay the undisturbed run's).
    out = tmp_path / "k"
    command = CLI + train_args(out, sample_prepared, *KILLABLE, *NAMED, "trainer.feed_processes=1")
    log_file = tmp_path / "k.log"  # a file, not a pipe: nothing blocks the driver while the test polls
    with log_file.open("w") as sink:
        proc = subprocess.Popen(command, cwd=REPO, env=cluster.env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        lost = lose_a_training_node(cluster, client, proc, "cluster-kill")
        cluster.add_node(lost["cpus"])

        def restarted_and_checkpointed() -> bool:
            record = json.loads((out / "run.json").read_text())["runs"][-1]
            restarts = client.get_metric_history(record["run_id"], "train/restarted_at_step")
            complete = _complete_checkpoints(record["storage"])
            return bool(restarts) and bool(complete) and _step(complete[-1]) > restarts[0].value

        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and not restarted_and_checkpointed():
            time.sleep(0.3)
        assert proc.poll() is None, log_file.read_text()[-3000:]
        feed_processes = _feed_processes(cluster)
        assert feed_processes, "the workers read in no feed process"
        proc.kill()
        killed_at = time.time()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    while (left := [p for p in feed_processes if p.is_running()]) and time.time() < killed_at + 30:
        time.sleep(0.5)
    assert not left, f"feed processes left 30 s after the driver's SIGKILL: {[p.pid for p in left]}"
    log = log_file.read_text()
    deadline = time.time() + 60  # Ray ends the dead driver's workers
    while training_hosts(cluster) and time.time() < deadline:
        time.sleep(0.5)
    record = json.loads((out / "run.json").read_text())["runs"][-1]  # the chain: this run alone
    assert not (out / "checkpoint").exists() and not (out / "train.json").exists()
    assert record["storage"] != info["storage"] and record["storage"].startswith(f"{BUCKET}/ray_results/shared/")
    assert set(keys(info["storage"])) == first_keys  # the first run's files as they were
    assert client.get_run(record["run_id"]).data.tags["convsts.storage"] == record["storage"]
    # Restarted once, at a checkpoint, and said so.
    restarts = [int(m.value) for m in client.get_metric_history(record["run_id"], "train/restarted_at_step")]
    starts = "\n".join(line for line in log.splitlines() if "start step" in line)
    assert len(restarts) == 1 and restarts[0] >= EVERY and restarts[0] % EVERY == 0, (restarts, starts)
    assert f"start step {restarts[0]}" in log
    complete = _complete_checkpoints(record["storage"])
    assert len(complete) >= 2, complete
    older, newest = (f"s3://{k}" for k in complete[-2:])
    fs, inner = storage.resolve(f"{newest}/train_state.pt")
    fs.delete_file(inner)  # what a kill during the upload of the newest checkpoint leaves

    at = json.loads(storage.read_text(f"{older}/config.json"))["step"]
    again = train(cluster, out, sample_prepared, *KILLABLE, *NAMED)
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    line = again.stderr.strip().splitlines()[-1]
    assert f"its newest complete checkpoint is {older} (step {at}); pass --resume latest to continue it" in line, line
    assert "an interrupted training run" in line and PASSWORD not in line

    resumed = train(cluster, out, sample_prepared, *KILLABLE, *NAMED, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"start step {at}" in resumed.stdout + resumed.stderr
    # The killed driver took its Ray Train controller with it: this OUT's next run to reach the
    # cluster (the refused one never does) releases that fit's reservation, in one line.
    released = [
        line
        for line in (again.stdout + again.stderr + resumed.stdout + resumed.stderr).splitlines()
        if "released the cluster reservation of" in line
    ]
    assert len(released) == 1, released
    assert f"of an earlier fit of this OUT, Ray Train run {record['ray_train_run']} " in released[0], released
    finished = json.loads((out / "train.json").read_text())
    assert json.loads((out / "checkpoint" / "config.json").read_text())["step"] == STEPS
    assert finished["storage"] != record["storage"]  # the continuing run owns its folder too
    killed, continuing = client.get_run(record["run_id"]), client.get_run(finished["mlflow_run_id"])
    assert killed.info.status == "KILLED" and continuing.info.status == "FINISHED"
    assert continuing.data.tags["convsts.continues"] == record["run_id"]
    # Each step's metrics once along the two runs, and the same losses and weights as the undisturbed
    # run, read from a folder of many shards (the trainer's feed keeps one order whatever the read
    # tasks' timing).
    assert len(list((sample_prepared / "reddit" / "train").glob("*.parquet"))) >= 8
    assert len(list((sample_prepared / "snli" / "train").glob("*.parquet"))) >= 8
    for name in ("reddit/loss", "snli/loss", "lr"):
        first, then = history(client, record["run_id"], name), history(client, finished["mlflow_run_id"], name)
        assert not set(first) & set(then), (name, sorted(set(first) & set(then)))  # each step once across the two
        assert {**first, **then} == history(client, info["mlflow_run_id"], name), name
    weights = [load_file(str(run / "checkpoint" / "model.safetensors")) for run in (info["out"], out)]
    assert weights[0].keys() == weights[1].keys()
    assert [k for k in weights[0] if not torch.equal(weights[0][k], weights[1][k])] == []
