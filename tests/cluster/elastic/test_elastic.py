"""Elastic task groups (trainer.num_workers=[MIN, MAX]) on a multi-node cluster of their own (conftest.py):
a head of one CPU and worker nodes of two; the driver is `convsts train` joined through
RAY_ADDRESS. A lost machine is a worker node's raylet killed with SIGKILL, everything under it
too, and no replacement joins until the group has shrunk to one worker; then one node joins and
the group grows at Ray's next resize check. The first node is lost before the run's first
checkpoint: the smaller group starts again from step 0. Covered: the run finishes every step, each
step logged once across the restarts (those before the first checkpoint too), every later restart
going on from a checkpoint, each resize said in one line and the group's size logged as
train/workers. CI's run (3 -> 2 -> 1 -> 2, its last single worker on the head, which it takes
whole) trains one task whose rows carry their ids (testkit.counted_task) on every rank, bucketed by
length, fed by the task's Ray Data pipeline and dealer (trainer.feed=ray_data, whose tasks then
share the trainers' CPUs: none is left): the rows its committed steps trained on (2 -> 1 -> 2),
counted from the workers' trace, are the epochs' one trained order read exactly once, whatever the
group's size. It is paced by events, not by a step count sized to one machine: each group waits at
a step of its own (counted_task's hold) until the test has lost its node, and the last single
worker until the node it grows onto hosts a worker. The release tier's run (3 -> 2 -> 1 -> 2, on
worker nodes only) trains Reddit and SNLI, their ranks planned anew at each size."""

from __future__ import annotations

import json
import re
import subprocess
from functools import partial
from pathlib import Path

import pytest
from testkit import counted_task
from testkit.local_cluster import poll_until
from testkit.multinode import BUCKET, CLI, REPO, training_hosts
from testkit.tiny import TINY_DAN

# The release tier's run: a tiny step of one worker takes under 10 ms, so the run is long enough that
# the single worker is still training when the node it grows onto has joined (Ray's resize check, a
# new group's start), and its first checkpoint comes seven log windows after the first logged step.
# CI's run is held at each size's step (HOLDS) until the test has done what that size waits for.
STEPS, EVERY, LOG = {"ci": 480, "release": 6000}, 80, 10
HOLDS = {3: 40, 2: 200, 1: 400}  # before the first checkpoint at 3; past checkpoints at 2 and at 1

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


def _reached(client, run_id: str, size: int, step: int) -> bool:
    """The group at `size` workers has logged `step`."""
    return _workers_at(client, run_id).get(step) == size


def _wait_for(what, check, proc: subprocess.Popen):
    """`check()`'s first true value while the driver runs, else fail naming `what`, with the end of
    the driver's output (the driver is stopped to read it)."""
    found = poll_until(check, proc, 420.0, every=0.5)
    if not found:
        code = proc.poll()
        proc.kill()
        assert found, f"{what}: not seen (driver exit code {code}); its output ends:\n{proc.communicate()[0][-6000:]}"
    return found


def _run_id(client, out: Path) -> str | None:
    record = out / "run.json"
    if not record.exists():
        return None
    runs = json.loads(record.read_text()).get("runs", [])
    return runs[-1]["run_id"] if runs else None


# Each variant: the group's largest size, its worker nodes (CPUs each, how many), a task worker's
# CPUs, the tasks and their prepared data, their losses.
# - CI's: [1,3] on the one-CPU head and two one-CPU nodes, a task worker a CPU, so the head hosts
#   one: 3 -> 2 -> 1 (the last on the head, which it takes whole: nothing else of the run needs a
#   CPU) -> 2, of counted_task on every rank (its rows counted);
# - the release tier's: [1,3] on three two-CPU nodes, a task worker two CPUs (none on the head, so
#   the group's size is the worker nodes left): 3 -> 2 -> 1 -> 2, of Reddit and SNLI.
# counted_task's order in blocks of one 100-row shard (conftest), so that a restart's seek is seen.
BLOCK = 100
COUNTED = [
    "task_modules=[testkit.counted_task]",
    "trainer.task_weights={counted: 1.0}",
    f"trainer.shuffle_block_rows={BLOCK}",
    "trainer.feed=ray_data",
    "trainer.bucket_batches=4",  # windows of 128 rows (4 batches of 32) sorted by length
]
VARIANTS = {
    "ci": (3, (1, 2), 1, COUNTED, "counted_prepared", ("counted/loss",)),
    "release": (3, (2, 3), 2, [], "sample_prepared", ("reddit/loss", "snli/loss")),
}


@pytest.mark.parametrize("variant", [pytest.param("ci"), pytest.param("release", marks=pytest.mark.release)])
def test_an_elastic_run_shrinks_as_nodes_are_lost_grows_when_one_joins_and_logs_each_step_once(
    cluster, request, tmp_path, variant
):
    from mlflow.tracking import MlflowClient

    top, (node_cpus, nodes), worker_cpus, tasks, prepared_fixture, losses = VARIANTS[variant]
    prepared, steps_total, held = request.getfixturevalue(prepared_fixture), STEPS[variant], variant == "ci"
    for old in cluster.row_trace.glob("*.jsonl"):
        old.unlink()
    hold = cluster.row_trace / counted_task.HOLD
    hold.unlink(missing_ok=True)
    if held:
        hold.write_text(str(HOLDS[top]))
    cluster.layout(cpus=node_cpus, count=nodes)
    client, out = MlflowClient(cluster.mlflow), tmp_path / "run"
    # Ray Train waits this long for the placement of a group of the size it chose before it chooses
    # again (Ray's default is 60 s): a group chosen while Ray still counts a lost node's CPUs waits it
    # out whole, while one that fits is placed within a second, even on a busy machine.
    env = {**cluster.env, "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}
    command = CLI + [
        "train", "--out", str(out), "--prepared", str(prepared), "name=elastic",
        f"trainer.storage_path={BUCKET}/elastic", f"trainer.num_workers=[1,{top}]", f"trainer.cpus_per_worker={worker_cpus}", "trainer.torch_threads=1",
        "trainer.resize_interval_s=5", "trainer.max_failures=6", f"trainer.steps={steps_total}",
        f"trainer.checkpoint_every={EVERY}", f"trainer.log_every={LOG}", "trainer.eval_every=0",
        "mlflow.experiment=elastic", *TINY_DAN, *tasks,
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_id = _wait_for("the run's MLflow id", lambda: _run_id(client, out), proc)
        sizes_seen = []
        for expected in range(top, 1, -1):  # lose a node that hosts a task worker at each size, no replacement
            if held:  # the group waits at its step: past its checkpoints, or before the first one at 3
                at = _wait_for(
                    f"step {HOLDS[expected]} at {expected} workers",
                    partial(_reached, client, run_id, expected, HOLDS[expected]),
                    proc,
                )
            elif expected == top:  # before the run's first checkpoint: the group starts again from step 0
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
            if held:
                hold.write_text(str(HOLDS[expected - 1]))
        # Room again once the single worker has checkpointed: the group grows at Ray's next resize check.
        if held:
            _wait_for(f"step {HOLDS[1]} at 1 worker", partial(_reached, client, run_id, 1, HOLDS[1]), proc)
        else:
            _wait_for("steps past a checkpoint at 1 worker", partial(_past_checkpoints, client, run_id, 1), proc)
        joined = cluster.add_node(node_cpus)
        if held:  # the single worker waits until the group of two has a worker on the node that joined
            _wait_for("a task worker on the node that joined", lambda: joined in training_hosts(cluster), proc)
            hold.unlink()
        log = proc.communicate(timeout=900)[0]
    finally:
        hold.unlink(missing_ok=True)
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
    expected_steps = set(range(LOG, steps_total + 1, LOG))
    starts = [int(line.rsplit("start step ", 1)[1].split()[0]) for line in log.splitlines() if "start step " in line]
    for name in (*losses, "train/workers"):
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
    assert json.loads((out / "checkpoint" / "config.json").read_text())["step"] == steps_total
    assert client.get_run(run_id).info.status == "FINISHED" and finished["mlflow_run_id"] == run_id
    assert client.get_run(run_id).data.params["trainer.num_workers"] == f"[1, {top}]"
    if variant == "ci":
        at_restarts = _each_row_once_per_epoch(cluster.row_trace, prepared, starts, out, steps_total)
        # Each restart from a checkpoint went on where the kept steps had read to, reading the blocks
        # that hold that row's bucketing window (128 rows: at most three blocks of 100): none before them.
        seeks = re.findall(r"counted: goes on at row (\d+) of epoch (\d+)'s order; read (\d+) rows of its shards", log)
        assert [(int(e), int(r)) for r, e, _ in seeks] == [at_restarts[s] for s in starts[2:]], (seeks, at_restarts)
        assert all(0 < int(k) <= 3 * BLOCK for _, _, k in seeks), seeks


def _each_row_once_per_epoch(
    trace: Path, prepared: Path, starts: list[int], out: Path, steps_total: int
) -> dict[int, tuple[int, int]]:
    """The rows of the committed steps (a group's steps up to the checkpoint the next group started
    from), each step's global batch its ranks' batches in rank order, are the epochs' one trained
    order (feed_order: sample_order's EpochOrder seeded by the run's seed and the task, its windows of
    128 rows bucketed by the lengths the run's tokenizer gives), read from each epoch's start in
    global batches of 32 rows a rank, an epoch's last rows that fill no global batch left out: every
    row of an epoch once, in order, across the group's sizes. Returns, for each group's start step,
    where in the order its first step went on from: (epoch, rows of it read)."""
    from convsts.datasets.sample_order import ShardSet
    from convsts.models.checkpoint import Checkpoint
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.training.data_feed import batch_encoder, feed_order
    from convsts.ray_jobs.training.feed_reader import Reader

    groups: dict[tuple[int, int], dict] = {}  # (start step, size) -> {"t": first batch's time, rank: its batches}
    for file in trace.glob("*.jsonl"):
        lines = [json.loads(line) for line in file.read_text().splitlines()]
        first = lines[0]
        group = groups.setdefault((first["start"], first["world"]), {"t": first["t"]})
        assert first["rank"] not in group, f"two workers of rank {first['rank']} in the group at {first}"
        group[first["rank"]], group["t"] = [line["rows"] for line in lines], min(group["t"], first["t"])
    ordered = sorted(groups.items(), key=lambda item: item[1]["t"])
    assert [start for (start, _), _ in ordered] == starts, (sorted(groups), starts)  # one group a start line
    manifest = json.loads((prepared / "counted" / "manifest.json").read_text())
    records = [(s["file"], int(s["rows"])) for s in manifest["shards"]["train"]]
    cfg = load_config(None, [*TINY_DAN, *COUNTED])
    task = get_task("counted", cfg.task_modules)
    shards = ShardSet.of_folder(str(prepared / "counted" / "train"), records, task.feed_columns(cfg))
    tokenizer = Checkpoint.at(out / "checkpoint").files().tokenizer
    order = feed_order(cfg, "counted", shards, tokenizer.pad_id)
    reader = Reader(order, batch_encoder(task, tokenizer, cfg.tokenizer.max_words, cfg), 32, 0)
    orders: dict[int, list[int]] = {}
    epoch, read, committed_at = 0, 0, []  # the sizes of the groups whose steps were kept, in turn
    at_start = {}
    for index, ((start, world), group) in enumerate(ordered):
        end = ordered[index + 1][0][0] if index + 1 < len(ordered) else steps_total
        at_start[start] = (epoch, read)
        for step in range(end - start):
            got = [row for rank in range(world) for row in group[rank][step]]
            if read + len(got) > order.rows:  # the epoch's last rows fill no global batch: the next epoch
                epoch, read = epoch + 1, 0
            if epoch not in orders:
                orders[epoch] = reader.epoch_rows(epoch)["row"].tolist()
            assert got == orders[epoch][read : read + len(got)], (start, world, step, epoch, read)
            read += len(got)
        committed_at += [world] if end > start else []
    assert committed_at == [2, 1, 2] and epoch > 0, (committed_at, epoch)  # epochs across the sizes
    return at_start
