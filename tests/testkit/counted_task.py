"""A task whose every row carries its own id, and which writes the ids of each batch it trains on to a
sidecar (test-only: where CONVSTS_TEST_ROW_TRACE names a folder in the workers' environment), so that a
test can count which rows a run trained on: each rank's batches in order, one JSON line a batch,
with the rank, the group's size, the step its group started from (the checkpoint Ray Train gave
it) and the time. A test paces the run by events: while that folder holds a file HOLD with a step,
a worker waits before it trains past that step (every rank trains this task at every step).
Added as a user adds a task (`task_modules: [testkit.counted_task]`); rows: `rows(n)`, their texts of
one to four words more on the left, so that length bucketing has lengths to sort."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

from torch import nn

from convsts.ray_jobs.tasks.base import Task, fields

TRACE_ENV = "CONVSTS_TEST_ROW_TRACE"
HOLD = "hold"  # in the trace folder: the step the workers wait at (a number), while it is there


def _wait_at_hold(folder: Path, step: int) -> None:
    """Before training step `step` + 1: wait while the folder's HOLD names a step <= `step`."""
    while True:
        try:
            limit = int((folder / HOLD).read_text())
        except (OSError, ValueError):
            return
        if step < limit:
            return
        time.sleep(0.05)


@functools.cache
def _group() -> dict[str, int]:  # its batches traced so far counted in it
    """This worker's rank, its group's size and the step the group started from (a worker process
    serves one group)."""
    import ray.train

    context, checkpoint = ray.train.get_context(), ray.train.get_checkpoint()
    start = int(checkpoint.path.rstrip("/").rsplit("-", 1)[1]) if checkpoint else 0  # checkpoint-<step>
    return {"rank": context.get_world_rank(), "world": context.get_world_size(), "start": start, "batches": 0}


class CountedTask(Task):
    name = "counted"
    head = "testkit.toy_task:SameFirstWordHead"
    pair = ("left", "right")
    label = "row"  # each row's id; the target is its parity

    def loss(self, model, batch):
        rows = batch[self.label]  # (B,)
        folder = os.environ.get(TRACE_ENV)
        if folder:
            group = _group()
            _wait_at_hold(Path(folder), group["start"] + group["batches"])
            with open(Path(folder) / f"{os.getpid()}.jsonl", "a") as trace:
                line = {k: v for k, v in group.items() if k != "batches"}
                trace.write(json.dumps({**line, "t": time.time(), "rows": rows.tolist()}) + "\n")
            group["batches"] += 1
        u, v = model.encode_both(fields(batch, "left"), fields(batch, "right"))
        logits = model.heads[self.name](u, v)  # (B,)
        target = (rows % 2).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logits, target)
        return loss, ((logits > 0).float() == target).float().mean()


TASK = CountedTask()


def rows(n: int):
    """`n` rows with ids 0 .. n-1 and texts of a few words."""
    import pandas as pd

    words = ["red", "blue", "green", "small", "large", "quick", "slow", "happy"]
    return pd.DataFrame(
        [
            {
                "left": f"{words[i % 8]} {words[(i // 8) % 8]} thing" + " more" * (i % 4),
                "right": f"{words[(i * 3) % 8]} other",
                "row": i,
            }
            for i in range(n)
        ]
    )
