"""A task whose every row carries its own id, and which writes the ids of each batch it trains on to a
sidecar (test-only: where CONVSTS_TEST_ROW_TRACE names a folder in the workers' environment), so that a
test can count which rows a run trained on: each rank's batches in order, one JSON line a batch,
with the rank, the group's size, the step its group started from (the checkpoint Ray Train gave
it) and the time. Added as a user adds a task (`task_modules: [testkit.counted_task]`); rows: `rows(n)`."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

from torch import nn

from convsts.ray_jobs.tasks.base import Task, fields

TRACE_ENV = "CONVSTS_TEST_ROW_TRACE"


@functools.cache
def _group() -> dict[str, int]:
    """This worker's rank, its group's size and the step the group started from (a worker process
    serves one group)."""
    import ray.train

    context, checkpoint = ray.train.get_context(), ray.train.get_checkpoint()
    start = int(checkpoint.path.rstrip("/").rsplit("-", 1)[1]) if checkpoint else 0  # checkpoint-<step>
    return {"rank": context.get_world_rank(), "world": context.get_world_size(), "start": start}


class CountedTask(Task):
    name = "counted"
    head = "testkit.toy_task:SameFirstWordHead"
    pair = ("left", "right")
    label = "row"  # each row's id; the target is its parity

    def loss(self, model, batch):
        rows = batch[self.label]  # (B,)
        folder = os.environ.get(TRACE_ENV)
        if folder:
            with open(Path(folder) / f"{os.getpid()}.jsonl", "a") as trace:
                trace.write(json.dumps({**_group(), "t": time.time(), "rows": rows.tolist()}) + "\n")
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
            {"left": f"{words[i % 8]} {words[(i // 8) % 8]} thing", "right": f"{words[(i * 3) % 8]} other", "row": i}
            for i in range(n)
        ]
    )
