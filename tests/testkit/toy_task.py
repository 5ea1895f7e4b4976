"""A toy task added the way a user adds one: this module plus config entries
(`task_modules: [testkit.toy_task]`, `trainer.task_weights.toy`, `data.task_inputs.toy`). Its head is
defined here too. Rows: two texts and whether they share their first word."""

from __future__ import annotations

import torch
from torch import nn

from convsts.ray_jobs.tasks.base import Task, fields


class SameFirstWordHead(nn.Module):
    def __init__(self, dim: int, config):
        super().__init__()
        self.score = nn.Linear(dim, 1)

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.score(u * v).squeeze(-1)  # (B,)


class ToyTask(Task):
    name = "toy"
    head = "testkit.toy_task:SameFirstWordHead"
    pair = ("left", "right")
    label = "same"

    def loss(self, model, batch):
        u, v = model.encode_both(fields(batch, "left"), fields(batch, "right"))
        logits = model.heads[self.name](u, v)  # (B,)
        target = batch[self.label].float()
        loss = nn.functional.binary_cross_entropy_with_logits(logits, target)
        return loss, ((logits > 0).float() == target).float().mean()


TASK = ToyTask()


def rows(n: int = 64):
    import pandas as pd

    words = ["red", "blue", "green", "small", "large", "quick", "slow", "happy"]
    out = []
    for i in range(n):
        a, b = words[i % len(words)], words[(i * 3 + 1) % len(words)]
        right_first = a if i % 2 == 0 else b
        out.append({"left": f"{a} {b} thing", "right": f"{right_first} other thing", "same": int(i % 2 == 0 or a == b)})
    return pd.DataFrame(out)
