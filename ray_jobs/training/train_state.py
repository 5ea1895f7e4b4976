"""What a checkpoint adds to the weights to continue a run exactly: optimizers, step, each rank's stream positions and random generators (TrainState, saved as the checkpoint's train state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from convsts.ray_jobs.training.task_groups import TaskPlan


def rng_state() -> dict[str, Any]:
    """torch's generators of this process: the CPU one (dropout on CPU) and, on a GPU, CUDA's."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """A rank's saved generators, or {"seed": N}: every generator of the process seeded with N."""
    if "seed" in state:
        torch.manual_seed(state["seed"])
    if "cpu" in state:
        torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _in_rows(position: dict[str, int], ranks: int) -> dict[str, int]:
    """A stream position as rows read of its epoch (one saved as batches read: each global batch
    was `ranks` x its batch size)."""
    if "rows" in position or "batch_in_epoch" not in position:
        return position
    rows = position["batch_in_epoch"] * position.get("batch_size", 0) * ranks
    return {"epoch": position.get("epoch", 0), "rows": rows, "batch_size": position.get("batch_size", 0)}


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
    # The ranks of each task in the group that wrote the state ({} in a checkpoint written before
    # this was kept: the plan is then rebuilt from the run's settings, loop.saved_plan).
    task_ranks: dict[str, list[int]] = field(default_factory=dict)

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
            task_ranks=data.get("task_ranks", {}),
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
            "task_ranks": self.task_ranks,
        }

    def load_optimizers(self, optimizers) -> None:
        for opt, sd in zip(optimizers.encoder, self.encoder_optimizers):
            opt.load_state_dict(sd)
        for task, opts in optimizers.heads.items():
            for opt, sd in zip(opts, self.head_optimizers.get(task, [])):
                opt.load_state_dict(sd)

    def positions_of(self, rank: int, plan: TaskPlan, saved: TaskPlan) -> dict[str, dict[str, int]]:
        """The stream positions of `rank` of `plan`: its own where the group that wrote the state had
        the same ranks for the same tasks (its task_ranks; `saved`, the plan rebuilt from the run's
        settings, for a state without them). Otherwise (an elastic group resized, a resume on another
        count or other task workers) each of the rank's tasks goes on from the task's position: a
        count of the epoch's rows read, the same on every rank of a task that draws together (the
        earliest of them where the ranks went at their own pace: the async split), which a stream
        at any number of ranks continues from (data_feed.TaskStream). A position written before
        positions were counts of rows (batch_in_epoch) counts the batches of its task's ranks then.
        A task the state holds no position for starts at epoch 0 (the loop says so)."""
        then, now = self.task_ranks or saved.ranks_by_task(), plan.ranks_by_task()
        if len(self.positions) == plan.world_size and all(then.get(t) == now[t] for t in plan.tasks_of(rank)):
            return {t: _in_rows(p, len(then.get(t, [1]))) for t, p in self.positions[rank].items()}
        out = {}
        for task in plan.tasks_of(rank):
            before = [r for r in then.get(task, []) if r < len(self.positions) and task in self.positions[r]]
            held = [_in_rows(self.positions[r][task], len(then[task])) for r in before]
            if held:
                out[task] = min(held, key=lambda p: (p.get("epoch", 0), p.get("rows", 0)))
        return out

    def rng_of(self, rank: int, world: int, seed: int) -> dict[str, Any]:
        """This rank's generator states; at another world size, torch's generators seeded from the
        run's seed, the step and the rank (the same on every restart at that size)."""
        if len(self.rng) == world:
            return self.rng[rank]
        return {"seed": seed * 1_000_003 + self.step * 1_009 + rank}

    def pushed_of(self, rank: int, world: int) -> int:
        """This rank's applied async updates so far; 0 when the worker count changed or the run was sync."""
        return self.pushed[rank] if len(self.pushed) == world else 0
