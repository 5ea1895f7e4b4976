"""An --out folder, said once (`RunFolder`): the path of everything `convsts train`, `demo`, `tune` and
`evaluate` write there and read back. training.lineage decides what the chain's files hold; this
module only names them, low in the layers so that every module that needs one (the tracking
store's default, the demo's sample) asks a RunFolder for it, and none builds a path inside OUT
itself (tests/cli/test_layering.py checks it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunFolder:
    """The --out folder at `root` and the paths inside it."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def run_record(self) -> Path:
        """OUT's chain of runs (training.lineage)."""
        return self.root / "run.json"

    @property
    def train_summary(self) -> Path:
        """Written when a run finishes."""
        return self.root / "train.json"

    @property
    def config(self) -> Path:
        """The resolved run config, as run."""
        return self.root / "config.yaml"

    @property
    def final_checkpoint(self) -> Path:
        """A finished run's last checkpoint."""
        return self.root / "checkpoint"

    @property
    def model(self) -> Path:
        """The encoder without optimizer state, with its model card."""
        return self.root / "model"

    @property
    def best_checkpoint(self) -> Path:
        """The best in-training STS-B dev (trainer.eval_every)."""
        return self.root / "best_checkpoint"

    @property
    def ray_results(self) -> Path:
        """Ray Train's run folders without a trainer.storage_path."""
        return self.root / "ray_results"

    @property
    def prepared(self) -> Path:
        """The prepared data without --prepared or data.prepared_dir."""
        return self.root / "prepared"

    @property
    def loss_curves(self) -> Path:
        """The per-task losses along OUT's chain."""
        return self.root / "loss_curves.png"

    @property
    def tracking_db(self) -> Path:
        """The sqlite tracking store without a tracking URI."""
        return self.root / "mlflow.db"

    def run_outputs(self) -> list[Path]:
        """What earlier training runs left in OUT: their record, train.json, checkpoints and model
        folder, Ray Train's own run folders (when they are local)."""
        paths = (self.run_record, self.train_summary, self.final_checkpoint, self.model, self.best_checkpoint)
        return [p for p in (*paths, self.ray_results) if p.exists()]
