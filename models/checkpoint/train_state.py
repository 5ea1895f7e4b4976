"""A checkpoint's train state as one type (TrainState, saved as train_state.pt): what a checkpoint adds
to the weights to continue a run exactly: optimizers, step, each rank's stream positions and random
generators, and the plan of the group that wrote it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """What a checkpoint adds to the weights to continue a run exactly (train_state.pt): plain values
    and tensors only, so that it loads with torch's weights_only."""

    step: int
    encoder_optimizers: list[dict[str, Any]] = field(default_factory=list)
    head_optimizers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    positions: list[dict[str, dict[str, Any]]] = field(default_factory=list)  # per rank: {task: position}
    world_size: int = 1
    mode: str = ""
    # async (trainer.task_split=async): the parameter holder's applied updates per task, and per
    # rank the updates it pushed that were applied; their sums are both `step`.
    task_updates: dict[str, int] = field(default_factory=dict)
    pushed: list[int] = field(default_factory=list)
    # The random state that drives what comes next: the task draws' generator (a torch.Tensor, the
    # same on every rank) and per rank torch's own generators (dropout; CUDA's too on a GPU).
    task_draws: Any = None
    rng: list[dict[str, Any]] = field(default_factory=list)
    # The ranks of each task in the group that wrote the state ({} in a checkpoint written before
    # this was kept: the plan is then rebuilt from the run's settings, training.loop.saved_plan).
    task_ranks: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        """The state of a dict as train_state.pt holds it (keys a newer writer added default)."""
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
        """The dict train_state.pt holds."""
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
        """Its optimizer states into `optimizers` (an encoder list and a list per task head)."""
        for opt, sd in zip(optimizers.encoder, self.encoder_optimizers):
            opt.load_state_dict(sd)
        for task, opts in optimizers.heads.items():
            for opt, sd in zip(opts, self.head_optimizers.get(task, [])):
                opt.load_state_dict(sd)

    def rng_of(self, rank: int, world: int, seed: int) -> dict[str, Any]:
        """This rank's generator states; at another world size, torch's generators seeded from the
        run's seed, the step and the rank (the same on every restart at that size)."""
        if len(self.rng) == world:
            return self.rng[rank]
        return {"seed": seed * 1_000_003 + self.step * 1_009 + rank}

    def pushed_of(self, rank: int, world: int) -> int:
        """This rank's applied async updates so far; 0 when the worker count changed or the run was sync."""
        return self.pushed[rank] if len(self.pushed) == world else 0
