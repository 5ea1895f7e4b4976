"""The stage schedule: piecewise-constant batch size and learning rate, with warm-up and decay."""

from __future__ import annotations

import math
from collections.abc import Sequence

from convsts.ray_jobs.config.schema import StageConfig


class StageSchedule:
    """Piecewise-constant (batch size, lr) stages from trainer.stages, the lr rising linearly from
    0 over the first `warmup_steps` steps and, with `decay` linear or cosine, falling from there
    toward 0 at step `total` (a factor on every stage's lr)."""

    def __init__(self, stages: Sequence[StageConfig], warmup_steps: int = 0, decay: str = "none", total: int = 0):
        self.stages = list(stages)
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.total = total

    def lr_at(self, step: int) -> float:
        """The lr of the step that follows `step` steps done."""
        lr = self.at(step).lr
        if step < self.warmup_steps:
            return lr * (step + 1) / self.warmup_steps
        if self.decay == "none" or self.total <= self.warmup_steps:
            return lr
        done = min(1.0, (step - self.warmup_steps) / (self.total - self.warmup_steps))  # 0 -> 1
        if self.decay == "linear":
            return lr * (1.0 - done)
        return lr * 0.5 * (1.0 + math.cos(math.pi * done))  # cosine

    def at(self, step: int) -> StageConfig:
        current = self.stages[0]
        for stage in self.stages:
            if stage.start_step <= step:
                current = stage
        return current
