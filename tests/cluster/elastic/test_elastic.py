"""Elastic task groups (trainer.num_workers=[MIN, MAX]) on a multi-node cluster of their own (conftest.py):
a head of one CPU and worker nodes of two; the driver is `convsts train` joined through
RAY_ADDRESS. A lost machine is a worker node's raylet killed with SIGKILL, everything under it
too, and no replacement joins until the group has shrunk to one worker; then one node joins and
the group grows at Ray's next resize check. The first node is lost before the run's first
checkpoint: the smaller group starts again from step 0. Covered: the run finishes every step, each
step logged once across the restarts (those before the first checkpoint too), every later restart
going on from a checkpoint, each resize said in one line and the group's size logged as
train/workers."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest
from testkit.local_cluster import poll_until
from testkit.multinode import BUCKET, CLI, REPO, training_hosts
from testkit.tiny import TINY_DAN

# A tiny step of one worker takes under 10 ms here (the worker reads its own data): the run is long
# enough that the single worker is still training when the node it grows onto has joined (Ray's
# resize check, a new group's start), and its first checkpoint comes seven log windows after the
# first logged step, time enough to lose a node in between at 2 workers (the group's start-up).
STEPS, EVERY, LOG = 6000, 80, 10

pytestmark = pytest.mark.slow


def _workers_at(client, run_id: str) -> dict[int, int]:
    return {m.step: int(m.value) for m in client.get_metric_history(run_id, "train/workers")}


def _past_checkpoints(client, run_id: str, size: int) -> list[int]:
    """The steps logged at `size` workers, once the group at that size has gone past the second
    checkpoint since its start (so that the first is registered: a restart goes on from a step > 0)."""
    steps = sorted(s for s, n in _workers_at(client, run_id).items() if n == size)
    first = steps[0] // EVERY if steps else 0
    return steps if any(s // EVERY >= max(first + 1, 2) and s % EVERY >= LOG for s in steps) else []


def _before_the_first_checkpoint(client, run_id: str, size: int) -> list[int]:
    """The steps logged at `size` workers, once there is one and the run is still a log window short
    of its first checkpoint; fails once the run has gone past it (the loss would come too late)."""
    steps = sorted(s for s, n in _workers_at(client, run_id).items() if n == size)
    assert not steps or steps[-1] < EVERY, f"the run passed its first checkpoint before a node was lost: {steps}"
    return steps if steps and steps[-1] <= EVERY - 2 * LOG else []


def _wait_for(what, check, proc: subprocess.Popen):
    """`check()`'s first true value while the driver runs, else fail naming `what`."""
    found = poll_until(check, proc, 420.0, every=0.5)
    assert found, f"{what}: not seen (driver exit code {proc.poll()})"
    return found


def _run_id(client, out: Path) -> str | None:
    record = out / "run.json"
    if not record.exists():
        return None
    runs = json.loads(record.read_text()).get("runs", [])
    return runs[-1]["run_id"] if runs else None


# The group's largest size: CI's run is [1,2] on two nodes (one shrink, one growth), the release
# tier's [1,3] on three (3 -> 2 -> 1, then 2).
@pytest.mark.parametrize("top", [pytest.param(2, id="ci"), pytest.param(3, id="release", marks=pytest.mark.release)])
def test_an_elastic_run_shrinks_as_nodes_are_lost_grows_when_one_joins_and_logs_each_step_once(
    cluster, sample_prepared, tmp_path, top
):
    from mlflow.tracking import MlflowClient

    # Worker nodes of two CPUs beside the one-CPU head. A task worker asks for 2 CPUs: one a node,
    # none on the head, so the group's size is the worker nodes left.
    cluster.layout(cpus=2, count=top)
    client, out = MlflowClient(cluster.mlflow), tmp_path / "run"
    # Ray Train waits this long for a group of the size it chose before it chooses again (its view of
    # a lost node's resources lags; Ray's default is 60 s).
    env = {**cluster.env, "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "20"}
    command = CLI + [
        "train", "--out", str(out), "--prepared", str(sample_prepared), "name=elastic",
        f"trainer.storage_path={BUCKET}/elastic", f"trainer.num_workers=[1,{top}]", "trainer.cpus_per_worker=2", "trainer.torch_threads=1",
        "trainer.resize_interval_s=5", "trainer.max_failures=6", f"trainer.steps={STEPS}",
        f"trainer.checkpoint_every={EVERY}", f"trainer.log_every={LOG}", "trainer.eval_every=0",
        "mlflow.experiment=elastic", *TINY_DAN,
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_id = _wait_for("the run's MLflow id", lambda: _run_id(client, out), proc)
        sizes_seen = []
        for expected in range(top, 1, -1):  # lose a node that hosts a task worker at each size, no replacement
            if expected == top:  # before the run's first checkpoint: the group starts again from step 0
                at = _wait_for(
                    f"a step at {expected} workers before the first checkpoint",
                    partial(_before_the_first_checkpoint, client, run_id, expected),
                    proc,
                )
            else:
                at = _wait_for(
                    f"steps past a checkpoint at {expected} workers",
                    partial(_past_checkpoints, client, run_id, expected),
                    proc,
                )
            sizes_seen.append((expected, at))
            hosts = training_hosts(cluster)
            assert hosts, "no worker node hosts a task worker"
            cluster.lose(hosts[0])
        # Room again once the single worker has checkpointed: the group grows at Ray's next resize check.
        _wait_for("steps past a checkpoint at 1 worker", partial(_past_checkpoints, client, run_id, 1), proc)
        cluster.add_node(2)
        log = proc.communicate(timeout=900)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log[-5000:]
    workers = _workers_at(client, run_id)
    sizes = [workers[s] for s in sorted(workers)]
    shrunk_then_grew = [n for i, n in enumerate(sizes) if i == 0 or n != sizes[i - 1]]
    assert shrunk_then_grew[: top + 1] == [*range(top, 0, -1), 2], (shrunk_then_grew, sizes_seen)
    for before, after in [*((n, n - 1) for n in range(top, 1, -1)), (1, 2)]:
        assert f"worker group resized from {before} to {after} at step" in log, log[-5000:]
    assert "a worker or its node was lost" in log and "Ray's resize check found room" in log
    # Every logged step once, none missing, across the restarts; the first restart (before any
    # checkpoint) starts again from step 0, every later one at a checkpoint's step.
    expected_steps = set(range(LOG, STEPS + 1, LOG))
    starts = [int(line.rsplit("start step ", 1)[1].split()[0]) for line in log.splitlines() if "start step " in line]
    for name in ("reddit/loss", "snli/loss", "train/workers"):
        points = client.get_metric_history(run_id, name)
        steps = [m.step for m in points]
        assert len(steps) == len(set(steps)) and set(steps) <= expected_steps, (name, sorted(steps))
        # At one worker each step's task is drawn (SNLI 5%): a window may hold no SNLI step. A group
        # that lost the SNLI rank's node may have logged a step's Reddit side only, and its replay at
        # one worker need not draw SNLI: the last group (grown back, to the end) has every SNLI step.
        at_two_or_more = {s for s in expected_steps if s > starts[-1] and workers[s] >= 2}
        assert set(steps) >= (expected_steps if name != "snli/loss" else at_two_or_more), (name, sorted(steps))
    assert starts[:2] == [0, 0] and len(starts) >= top + 1, starts
    assert all(s > 0 and s % EVERY == 0 for s in starts[2:]), starts
    restarts = [int(m.value) for m in client.get_metric_history(run_id, "train/restarted_at_step")]
    assert sorted(restarts) == sorted(starts[1:]), (restarts, starts)
    finished = json.loads((out / "train.json").read_text())
    assert json.loads((out / "checkpoint" / "config.json").read_text())["step"] == STEPS
    assert client.get_run(run_id).info.status == "FINISHED" and finished["mlflow_run_id"] == run_id
    assert client.get_run(run_id).data.params["trainer.num_workers"] == f"[1, {top}]"
