"""Asynchronous task groups on a real local Ray instance (`convsts train` with
trainer.task_split=async, 1 Reddit + 1 SNLI worker and the parameter-holder actor): both tasks train,
the holder's applied updates equal the workers' pushed ones and come in the weights' 19:1 ratio,
and the run resumes from its last checkpoint after its parameter holder is killed and again after
a worker is killed, ending at exactly trainer.steps updates."""

import json
import os
import signal

import pytest
from testkit.local_cluster import poll_until, ray_processes, start_train
from testkit.tiny import TINY_DAN

from convsts.models.checkpoint import Checkpoint, load_model
from convsts.ray_jobs.tracking import runs as tracking

STEPS, EVERY, SLACK = 250, 50, 2
ARGS = [
    f"trainer.steps={STEPS}",
    f"trainer.checkpoint_every={EVERY}",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "trainer.max_failures=3",
    "trainer.task_split=async",
    f"trainer.async_slack={SLACK}",
    "trainer.num_workers=2",
    "trainer.async_overlap=true",  # one update in flight: the checkpoints and the end come with one pending
    *TINY_DAN,
    "mlflow.experiment=async-test",
]
# Each task's count stays within slack + its workers of its share (ray_jobs/training/parameter_holder.py); +1 for the rounding.
TOLERANCE = SLACK + 2


@pytest.mark.slow
def test_async_groups_train_both_tasks_and_resume_after_killing_the_holder_and_a_worker(
    ray_session, sample_prepared, mlflow_uri, tmp_path
):
    out = tmp_path / "run"
    proc = start_train(
        ray_session, out, ["--prepared", str(sample_prepared), *ARGS, f"mlflow.tracking_uri={mlflow_uri}"]
    )
    client = tracking.client(mlflow_uri)

    def progress():
        """(checkpoints written, last logged update, restarts so far) once the run exists."""
        run_id = tracking.find_run(mlflow_uri, "async-test", {"convsts.job": "train"})
        if not run_id:
            return None
        history = client.get_metric_history(run_id, "async/reddit/updates")
        states = list((out / "ray_results").rglob("train_state.pt"))
        return (
            len(states),
            max((m.step for m in history), default=0),
            len(client.get_metric_history(run_id, "train/restarted_at_step")),
        )

    try:
        # 1. The parameter holder's process dies once a checkpoint exists and training has gone past it.
        assert poll_until(lambda: (p := progress()) and p[0] and p[1] >= EVERY + 60, proc, 300), "no checkpoint"
        holders = ray_processes(b"ray::ParameterHolder")
        assert len(holders) == 1, holders
        os.kill(holders[0], signal.SIGKILL)
        killed = [holders[0]]
        # 2. Once the group has restarted and passed another checkpoint, a worker dies.
        assert poll_until(lambda: (p := progress()) and p[2] == 1 and p[1] >= 2 * EVERY + 60, proc, 300), (
            "no restart after the holder died"
        )
        workers = ray_processes(b"ray::RayTrainWorker")
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGKILL)
        killed.append(workers[0])
        log = proc.communicate(timeout=600)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log[-4000:]
    # Each killed process is named in one line that says the run went on without it.
    for pid, actor in zip(killed, ("ParameterHolder", "RayTrainWorker"), strict=True):
        died = [line for line in log.splitlines() if f"a Ray worker process died: pid {pid} " in line]
        assert len(died) == 1 and f"running {actor} (SYSTEM_ERROR: " in died[0], (pid, log[-4000:])
        assert died[0].endswith("Ray started another worker in its place and the work went on"), died

    train = json.loads((out / "train.json").read_text())
    assert train["task_split_mode"] == "async"
    state = Checkpoint.at(train["checkpoint"]).train_state()
    updates, pushed = state.task_updates, state.pushed
    # Exactly trainer.steps updates, each one a worker pushed (the restarts rolled both back together).
    assert state.step == STEPS == sum(updates.values()) == sum(pushed), (state.step, updates, pushed)
    # The weights' 19:1: SNLI's 5% of the updates, within the holder's tolerance.
    assert updates["snli"] >= 1 and abs(updates["snli"] - 0.05 * STEPS) <= TOLERANCE, updates
    # Both restarts resumed from a checkpoint: its update count is at a checkpoint_every multiple, plus at
    # most one update per other worker that was already on its way.
    restarts = [int(m.value) for m in client.get_metric_history(train["mlflow_run_id"], "train/restarted_at_step")]
    assert len(restarts) == 2, log[-4000:]
    assert all(EVERY <= r and r % EVERY < 2 for r in restarts), restarts
    assert all(f"start step {r}" in log for r in restarts)
    # Per-task metrics from both groups and the holder's own.
    metrics = client.get_run(train["mlflow_run_id"]).data.metrics
    for key in (
        "reddit/loss",
        "snli/loss",
        "snli/batch_accuracy",
        "async/reddit/staleness_mean",
        "async/snli/updates",
        "async/snli/wait_s",
        "async/reddit/pairs_per_s",
    ):
        assert key in metrics, key
    model = load_model(train["checkpoint"]).model  # the same checkpoint format as a sync run
    assert set(model.heads) == {"reddit", "snli"}
