"""A run on the multi-node cluster (conftest.py) whose driver is SIGKILLed goes on from its newest
complete checkpoint in the bucket, with the losses of the undisturbed run."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from testkit.multinode import BUCKET, CLI, KILLABLE, PASSWORD, REPO, STEPS, history, train, train_args, training_hosts
from testkit.s3_server import keys

pytestmark = pytest.mark.slow


def _complete_checkpoints(folder_uri: str) -> list[str]:
    """The checkpoint folders under a bucket prefix whose manifest (written last) is there, oldest step first."""
    folders = [k.rsplit("/", 1)[0] for k in keys(folder_uri) if k.endswith("/manifest.json")]
    return sorted(folders, key=lambda f: int(f.rsplit("-", 1)[1]))


def test_a_run_whose_driver_is_killed_goes_on_from_its_newest_complete_checkpoint(
    one_cpu_nodes, undisturbed, sample_prepared, tmp_path
):
    """`convsts train` with checkpoints in the bucket, its driver SIGKILLed after two checkpoints, the
    newer one left as an upload cut short leaves it (no train_state.pt). OUT holds only the run's
    record. The same command is refused in one line naming the newest complete checkpoint;
    `--resume latest` continues from it to trainer.steps; across the killed run (KILLED) and the one
    that continues it (tagged convsts.continues) every step is logged once, with the losses of an
    undisturbed run."""
    from mlflow.tracking import MlflowClient

    from convsts.io import storage

    cluster = one_cpu_nodes
    out, client = tmp_path / "k", MlflowClient(cluster.mlflow)
    named = ("name=long", "mlflow.experiment=cluster-kill")
    command = CLI + train_args(out, sample_prepared, *KILLABLE, *named)
    proc = subprocess.Popen(command, cwd=REPO, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while (
            time.time() < deadline
            and proc.poll() is None
            and len(_complete_checkpoints(f"{BUCKET}/ray_results/long")) < 2
        ):
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        proc.kill()  # the driver dies: a killed job, a closed laptop, an OOM on the head
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.time() + 60  # Ray ends the dead driver's workers
    while training_hosts(cluster) and time.time() < deadline:
        time.sleep(0.5)
    record = json.loads((out / "run.json").read_text())["runs"][-1]  # the chain: this run alone
    assert not (out / "checkpoint").exists() and not (out / "train.json").exists()
    assert record["storage"].startswith(f"{BUCKET}/ray_results/long/")
    complete = _complete_checkpoints(record["storage"])
    assert len(complete) >= 2, complete
    older, newest = (f"s3://{k}" for k in complete[-2:])
    fs, inner = storage.resolve(f"{newest}/train_state.pt")
    fs.delete_file(inner)  # what a kill during the upload of the newest checkpoint leaves

    at = json.loads(storage.read_text(f"{older}/config.json"))["step"]
    again = train(cluster, out, sample_prepared, *KILLABLE, *named)
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    line = again.stderr.strip().splitlines()[-1]
    assert f"its newest complete checkpoint is {older} (step {at}); pass --resume latest to continue it" in line, line
    assert "an interrupted training run" in line and PASSWORD not in line

    resumed = train(cluster, out, sample_prepared, *KILLABLE, *named, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"start step {at}" in resumed.stdout + resumed.stderr
    finished = json.loads((out / "train.json").read_text())
    assert json.loads((out / "checkpoint" / "config.json").read_text())["step"] == STEPS
    assert finished["storage"] != record["storage"]  # the continuing run owns its folder too
    killed, continuing = client.get_run(record["run_id"]), client.get_run(finished["mlflow_run_id"])
    assert killed.info.status == "KILLED" and continuing.info.status == "FINISHED"
    assert continuing.data.tags["convsts.continues"] == record["run_id"]
    for name in ("reddit/loss", "snli/loss", "lr"):
        first, then = history(client, record["run_id"], name), history(client, finished["mlflow_run_id"], name)
        assert not set(first) & set(then), (name, sorted(set(first) & set(then)))  # each step once across the two
        assert {**first, **then} == history(client, undisturbed["mlflow_run_id"], name), name
