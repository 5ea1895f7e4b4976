"""Worker state without Ray: where training starts from (restore), the stage schedule, the
per-task metric windows and the train state saved with each checkpoint."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from convsts.models.checkpoint import build_model, load_model, load_train_state, load_weights
from convsts.ray_jobs.config.schema import RunConfig, StageConfig
from convsts.ray_jobs.tasks import model_heads, trained_tasks
from convsts.ray_jobs.training.step import seed_everything

# ---------------------------------------------------------------------------------------------
# Where a run starts


def initial_model(cfg: RunConfig, tokenizer, warm_start: bool = True):
    """The weights a fresh run starts from, as every worker builds them: the seeded initialisation
    (the pretrained weights for model.encoder=pretrained), then the warm start when there is one
    (`warm_start=False`: the caller restores a checkpoint over it). `trainer.steps=0` saves exactly
    this model; the demo scores it beside the trained one."""

    seed_everything(cfg.seed)  # identical initial weights on every rank
    model = build_model(copy.deepcopy(cfg.model), tokenizer, model_heads(cfg))  # building fills hf_config
    warm_heads = [t for t, task in trained_tasks(cfg).items() if task.keeps_head_on_warm_start]
    if warm_start:
        restore(model, warm_start=cfg.trainer.warm_start or None, warm_heads=warm_heads)
    return model


def restore(
    model,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    warm_start: str | None = None,
    warm_heads: Sequence[str] = (),
) -> TrainState | None:
    """Load weights into `model` from the first source given and return the train state to
    continue from (None for a fresh or warm-started run):
      checkpoint_dir  Ray Train's latest checkpoint after a worker-group restart;
      resume_from     a checkpoint the user resumes (weights, optimizers, step, data position);
      warm_start      a checkpoint whose encoder (and the heads of `warm_heads`) initialise a new run."""
    source = checkpoint_dir or resume_from
    if source:
        load_weights(model, source)  # a head the checkpoint lacks keeps its initial weights (said by the driver)
        raw = load_train_state(source)
        return TrainState.from_dict(raw) if raw else None
    if warm_start:
        warm = load_model(warm_start).model
        model.encoder.load_state_dict(warm.encoder.state_dict())
        for task in warm_heads:
            if task in warm.heads and task in model.heads:
                model.heads[task].load_state_dict(warm.heads[task].state_dict())
    return None


# ---------------------------------------------------------------------------------------------
# Stages


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


# ---------------------------------------------------------------------------------------------
# Data positions


def resume_skip(position: dict[str, int], batch_size: int) -> tuple[int, int]:
    """(epoch, batches to skip) to continue a task stream from a saved position. A position saved
    at another batch size (a stage change since) restarts its epoch."""
    skip = position.get("batch_in_epoch", 0) if position.get("batch_size") == batch_size else 0
    return position.get("epoch", 0), skip


# ---------------------------------------------------------------------------------------------
# Metric windows


class MetricWindow:
    """Per-task loss and accuracy over the steps since the last log line. Values are kept as device
    tensors and read once per window, so a step never waits for the device to report its loss."""

    def __init__(self, tasks: Sequence[str]):
        self.tasks = list(tasks)
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, dict[str, Any]] = {t: {"loss": 0.0, "acc": 0.0, "n": 0, "pairs": 0} for t in self.tasks}
        self.started = time.time()

    def add(self, task: str, loss: torch.Tensor, accuracy: torch.Tensor, pairs: int) -> None:
        w = self.sums[task]
        w["loss"] = w["loss"] + loss
        w["acc"] = w["acc"] + accuracy
        w["n"] += 1
        w["pairs"] += pairs

    def summary(self, tasks: Sequence[str]) -> dict[str, float]:
        """{task/loss, task/batch_accuracy, task/pairs_per_s} of `tasks` over the window."""
        elapsed = max(time.time() - self.started, 1e-9)
        out: dict[str, float] = {}
        for t in tasks:
            w = self.sums[t]
            if w["n"]:
                out.update(
                    {
                        f"{t}/loss": float(w["loss"]) / w["n"],
                        f"{t}/batch_accuracy": float(w["acc"]) / w["n"],
                        f"{t}/pairs_per_s": w["pairs"] / elapsed,
                    }
                )
        return out

    def seconds(self) -> float:
        return max(time.time() - self.started, 1e-9)


def format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


# ---------------------------------------------------------------------------------------------
# Train state


def rng_state() -> dict[str, Any]:
    """torch's generators of this process: the CPU one (dropout on CPU) and, on a GPU, CUDA's."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    if "cpu" in state:
        torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class TrainState:
    """What a checkpoint adds to the weights to continue a run exactly (train_state.pt)."""

    step: int
    encoder_optimizers: list[dict[str, Any]] = field(default_factory=list)
    head_optimizers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    positions: list[dict[str, dict[str, int]]] = field(default_factory=list)  # per rank: {task: position}
    world_size: int = 1
    mode: str = ""
    # async (trainer.task_split=async): the parameter holder's applied updates per task, and per
    # rank the updates it pushed that were applied; their sums are both `step`.
    task_updates: dict[str, int] = field(default_factory=dict)
    pushed: list[int] = field(default_factory=list)
    # The random state that drives what comes next: the task draws' generator (the same on every
    # rank) and per rank torch's own generators (dropout; CUDA's too on a GPU).
    task_draws: torch.Tensor | None = None
    rng: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        return cls(
            step=data["step"],
            encoder_optimizers=data.get("encoder_optimizers", []),
            head_optimizers=data.get("head_optimizers", {}),
            positions=data.get("positions", []),
            world_size=data.get("world_size", 1),
            mode=data.get("mode", ""),
            task_updates=data.get("task_updates", {}),
            pushed=data.get("pushed", []),
            task_draws=data.get("task_draws"),
            rng=data.get("rng", []),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "encoder_optimizers": self.encoder_optimizers,
            "head_optimizers": self.head_optimizers,
            "positions": self.positions,
            "world_size": self.world_size,
            "mode": str(self.mode),
            "task_updates": self.task_updates,
            "pushed": self.pushed,
            "task_draws": self.task_draws,
            "rng": self.rng,
        }

    def load_optimizers(self, optimizers) -> None:
        for opt, sd in zip(optimizers.encoder, self.encoder_optimizers):
            opt.load_state_dict(sd)
        for task, opts in optimizers.heads.items():
            for opt, sd in zip(opts, self.head_optimizers.get(task, [])):
                opt.load_state_dict(sd)

    def positions_of(self, rank: int, world: int) -> dict[str, dict[str, int]]:
        """This rank's saved stream positions; none when the worker count changed."""
        return self.positions[rank] if len(self.positions) == world else {}

    def rng_of(self, rank: int, world: int) -> dict[str, Any]:
        """This rank's generator states; none when the worker count changed."""
        return self.rng[rank] if len(self.rng) == world else {}

    def pushed_of(self, rank: int, world: int) -> int:
        """This rank's applied async updates so far; 0 when the worker count changed or the run was sync."""
        return self.pushed[rank] if len(self.pushed) == world else 0
