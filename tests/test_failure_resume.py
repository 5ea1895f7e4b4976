"""A real Ray Train worker process killed mid-run is replaced (FailureConfig) and training resumes
from the last checkpoint, losing no more than one checkpoint interval."""

import json
import os
import signal
import time

import pytest
from local_cluster import ray_processes, start_train
from tiny import TINY_DAN

from convsts.models.checkpoint import load_train_state
from convsts.ray_jobs import tracking

STEPS, EVERY = 800, 200
TINY = [
    f"trainer.steps={STEPS}",
    f"trainer.checkpoint_every={EVERY}",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.keep_checkpoints=2",
    "trainer.max_failures=2",
    *TINY_DAN,
    "mlflow.experiment=failure-test",
]


@pytest.mark.slow
def test_killed_worker_is_replaced_and_training_resumes(ray_session, sample_prepared, mlflow_uri, tmp_path):
    out = tmp_path / "run"
    proc = start_train(
        ray_session, out, ["--prepared", str(sample_prepared), *TINY, f"mlflow.tracking_uri={mlflow_uri}"]
    )
    # Kill once a checkpoint exists and training has gone on past it (the controller registers a
    # reported checkpoint a moment after the files are written).
    client = tracking.client(mlflow_uri)
    checkpoint_steps, last_step = [], 0
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        states = list((out / "ray_results").rglob("train_state.pt"))
        run_id = tracking.find_run(mlflow_uri, "failure-test", {"convsts.job": "train"})
        if states and run_id:
            history = client.get_metric_history(run_id, "reddit/loss")
            last_step = max((m.step for m in history), default=0)
            if last_step >= EVERY + 40:
                checkpoint_steps = [load_train_state(s.parent)["step"] for s in states]
                break
        time.sleep(0.2)
    assert checkpoint_steps, "no checkpoint was written"
    victims = ray_processes(b"ray::RayTrainWorker")  # this test's Ray instance only
    assert len(victims) == 2
    os.kill(victims[0], signal.SIGKILL)  # a real worker process dies mid-run
    killed_at = time.time()
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log[-4000:]

    train = json.loads((out / "train.json").read_text())
    assert load_train_state(train["checkpoint"])["step"] == STEPS
    restarts = client.get_metric_history(train["mlflow_run_id"], "train/restarted_at_step")
    starts = [line for line in log.splitlines() if "start step" in line or "died" in line.lower()]
    assert len(restarts) == 1, f"the worker group was not restarted exactly once (killed {victims[0]}):\n" + "\n".join(
        starts
    )
    restart_step = int(restarts[0].value)
    # The last step logged before the kill, against the step training went on from.
    history = client.get_metric_history(train["mlflow_run_id"], "reddit/loss")
    before_kill = max(m.step for m in history if m.timestamp / 1000 <= killed_at)
    assert restart_step >= max(checkpoint_steps) and restart_step % EVERY == 0
    assert 0 <= before_kill - restart_step <= EVERY, (before_kill, restart_step)
    assert "start step 0" in log and f"start step {restart_step}" in log
    # The steps replayed after the restart are not logged again: one point per step and metric.
    for name in ("reddit/loss", "snli/loss", "lr"):
        steps = [m.step for m in client.get_metric_history(train["mlflow_run_id"], name)]
        assert steps and len(steps) == len(set(steps)), (name, sorted(steps))
