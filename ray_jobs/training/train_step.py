"""One training step, without Ray: forward one task's batch, backward, combine gradients across
ranks (a no-op in one process), clip, update. Used by the Ray Train worker, the benchmarks and the
tests alike."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from convsts.ray_jobs.config.schema import TrainerConfig
from convsts.ray_jobs.training.task_groups import GradientCombiner


def seed_everything(seed: int) -> None:
    """torch (initial weights, dropout), numpy and Python's random from the run config's seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_optimizer(
    trainer: TrainerConfig,
    params: Sequence[torch.nn.Parameter],
    sparse: Sequence[torch.nn.Parameter],
    lr: float,
    scale: float = 1.0,
) -> list[torch.optim.Optimizer]:
    """Optimizers for `params`; those also in `sparse` (sparse gradients: the DAN's embedding
    tables) learn at the stage's lr, the dense ones at lr x trainer.dense_lr_scale; all of them
    also x `scale` (a task head's trainer.head_lr_scale). Each param group carries its
    "lr_scale", which `set_lr` keeps at stage changes."""
    sparse_ids = {id(p) for p in sparse}
    tables = [p for p in params if id(p) in sparse_ids]
    dense = [p for p in params if id(p) not in sparse_ids]
    dense_scale = scale * trainer.dense_lr_scale
    groups: list[dict[str, Any]] = [
        g
        for g in (
            {"params": tables, "lr": lr * scale, "lr_scale": scale},
            {"params": dense, "lr": lr * dense_scale, "lr_scale": dense_scale},
        )
        if g["params"]
    ]
    if trainer.optimizer == "sgd":
        return [torch.optim.SGD(groups, lr=lr, momentum=trainer.momentum)]
    if trainer.optimizer == "adagrad":
        return [torch.optim.Adagrad(groups, lr=lr)]
    opts: list[torch.optim.Optimizer] = []
    for group in groups:  # Adam cannot take sparse gradients: SparseAdam for the tables
        if group["params"] is tables:
            opts.append(torch.optim.SparseAdam([group], lr=group["lr"]))
        elif trainer.optimizer == "adamw":
            opts.append(torch.optim.AdamW([group], lr=group["lr"], weight_decay=trainer.weight_decay))
        else:
            opts.append(torch.optim.Adam([group], lr=group["lr"]))
    return opts


def set_lr(optimizers: Sequence[torch.optim.Optimizer], lr: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)


@dataclass
class Optimizers:
    """The encoder's optimizers and, per task this rank trains, its head's."""

    encoder: list[torch.optim.Optimizer]
    heads: dict[str, list[torch.optim.Optimizer]] = field(default_factory=dict)

    @classmethod
    def build(cls, trainer: TrainerConfig, model, tasks: Sequence[str], lr: float) -> Optimizers:
        sparse = model.sparse_parameters()

        def trainable(module) -> list[torch.nn.Parameter]:  # frozen layers (requires_grad False) left out
            return [p for p in module.parameters() if p.requires_grad]

        return cls(
            make_optimizer(trainer, trainable(model.encoder), sparse, lr),
            {
                t: make_optimizer(trainer, trainable(model.heads[t]), sparse, lr, trainer.head_lr_scale.get(t, 1.0))
                for t in tasks
            },
        )

    def all(self) -> list[torch.optim.Optimizer]:
        return self.encoder + [o for opts in self.heads.values() for o in opts]

    def for_task(self, task: str) -> list[torch.optim.Optimizer]:
        return self.encoder + self.heads[task]

    def set_lr(self, lr: float) -> None:
        set_lr(self.all(), lr)


def train_step(
    model,
    task,
    batch: dict[str, torch.Tensor],
    optimizers: Optimizers,
    combiner: GradientCombiner,
    grad_clip: float = 0.0,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One update on `task`'s batch; returns (loss, accuracy) as detached 0-dim tensors on the
    model's device (reading them is the caller's choice: it waits for the device). With precision
    "bf16" the forward pass and loss run under bfloat16 autocast; gradients and weights stay fp32."""
    for opt in optimizers.all():
        opt.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss, accuracy = task.loss(model, batch)
    loss = loss.float()
    loss.backward()
    combiner.combine(model, task.name)
    if grad_clip > 0:
        sparse = {id(p) for p in model.sparse_parameters()}
        dense = [
            p
            for p in [*model.encoder.parameters(), *model.heads[task.name].parameters()]
            if p.grad is not None and id(p) not in sparse
        ]
        torch.nn.utils.clip_grad_norm_(dense, grad_clip)
    for opt in optimizers.for_task(task.name):
        opt.step()
    return loss.detach(), accuracy.detach()
