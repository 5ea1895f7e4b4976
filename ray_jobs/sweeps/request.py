"""What one `convsts tune` asks for: the space, the base config, OUT and the inputs its objective
takes. Read by the command before the sweep's library (Ray Tune, torch, MLflow) is loaded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convsts.io.errors import ConfigError
from convsts.ray_jobs.config.schema import RunConfig
from convsts.tune_spaces import TuneSpace


@dataclass(frozen=True)
class MatrixInputs:
    """What an sts_matrix sweep tunes: the STS matrix over the embeddings of `checkpoint`."""

    checkpoint: str

    @property
    def starts_from(self) -> str:
        """The checkpoint the sweep's trials start from (MLflow's tune.checkpoint)."""
        return self.checkpoint


@dataclass(frozen=True)
class TrainInputs:
    """What a train sweep's trials train on: `prepared_dir` (None: the config's data.prepared_dir,
    else OUT/prepared), each trial warm-started from `reddit_checkpoint` when given (Figure 8's
    curve), else from trainer.warm_start or from scratch."""

    reddit_checkpoint: str | None = None
    prepared_dir: str | None = None

    @property
    def starts_from(self) -> str:
        """The checkpoint the sweep's trials start from ("": trainer.warm_start or scratch)."""
        return self.reddit_checkpoint or ""


def sweep_inputs(
    space: TuneSpace, checkpoint: str | None, reddit_checkpoint: str | None, prepared_dir: str | None
) -> MatrixInputs | TrainInputs:
    """The inputs `space`'s objective takes from `convsts tune`'s options, refused in one line when
    one it needs is missing or one is given that it would not use."""
    if space.objective == "sts_matrix":
        if not checkpoint:
            raise ConfigError(f"space {space.name} needs --checkpoint (the encoder whose embeddings are tuned)")
        unused = [
            flag for flag, value in (("--reddit-checkpoint", reddit_checkpoint), ("--prepared", prepared_dir)) if value
        ]
        if unused:
            raise ConfigError(
                f"space {space.name} tunes a trained encoder's STS matrix: {', '.join(unused)} would do nothing"
            )
        return MatrixInputs(checkpoint)
    if checkpoint:
        raise ConfigError(
            f"space {space.name} trains: --checkpoint names an sts_matrix sweep's encoder; a train sweep's trials "
            "warm-start from --reddit-checkpoint"
        )
    return TrainInputs(reddit_checkpoint, prepared_dir)


@dataclass
class SweepRequest:
    """One `convsts tune`: the space over the base config into out_dir, with the inputs its
    objective takes (sweep_inputs). `param_overrides`: the --param dimensions (Tune domains);
    `num_samples`: of the random dimensions; `fresh`: start over rather than resume; a failed trial
    is retried `max_failures` times from its own last checkpoint."""

    space: TuneSpace
    cfg: RunConfig
    out_dir: Path
    inputs: MatrixInputs | TrainInputs
    param_overrides: dict[str, Any] = field(default_factory=dict)
    num_samples: int = 0  # 0: the space's own
    fresh: bool = False
    max_concurrent: int | None = None
    max_failures: int = 2

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir).resolve()
        self.num_samples = self.num_samples or self.space.num_samples

    @property
    def experiment_path(self) -> Path:
        """Ray Tune's own state of the sweep."""
        return self.out_dir / "ray_tune" / self.space.name


class SweepInterrupted(RuntimeError):
    """Trials left unfinished (the sweep was stopped): the same command resumes it."""


class SweepTrialsFailed(RuntimeError):
    """Trials that failed after every retry; the others' results are written."""
