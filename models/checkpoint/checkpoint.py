"""`Checkpoint`: a checkpoint folder (local or a URI) and its step, the type every reader of a
checkpoint takes; what a reader needs of one goes through its methods."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from convsts.io import storage
from convsts.io.errors import BadInputError
from convsts.io.redaction import redact
from convsts.models.checkpoint.manifest import (
    Hashed,
    damaged_file,
    embeddings_digest,
    incomplete_reason,
    verified_folder,
)
from convsts.models.checkpoint.names import CONFIG_FILE
from convsts.models.checkpoint.reading import ModelFiles, read_model_files
from convsts.models.checkpoint.tensors import LoadedModel, load_model, load_train_state
from convsts.models.checkpoint.train_state import TrainState

if TYPE_CHECKING:
    from convsts.models.sts_transform import StsTransform


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder (local or a URI): where it is and its step; the MLflow run that wrote it,
    where that was read (its config.json: `Checkpoint.at`) and it was written inside a training run;
    the run's checkpoint folder it was listed in (listed_steps), where it was. What every reader
    needs of it goes through its methods."""

    path: str
    step: int
    run_id: str | None = None
    folder: str | None = None

    @classmethod
    def at(cls, path: str | Path) -> Checkpoint:
        """The checkpoint at `path` with the step and writing run its config.json names (local or a
        URI: one small read); BadInputError naming the file where it is missing, not JSON or without
        an int step."""
        file = storage.join(str(path), CONFIG_FILE)
        try:
            meta = json.loads(storage.read_text(file))
            step, provenance = meta["step"], meta.get("provenance") or {}
            run_id = provenance.get("run_id")
            if isinstance(step, int) and not isinstance(step, bool) and (run_id is None or isinstance(run_id, str)):
                return cls(str(path), step, run_id)
            reason = "its step or run_id is not of the type convsts writes"
        except FileNotFoundError:
            reason = "missing"
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            reason = f"not a checkpoint's config ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        raise BadInputError(f"{redact(file)}: {reason}; the checkpoint is damaged")

    def with_run(self, run_id: str | None) -> Checkpoint:
        """This checkpoint with the run that wrote it, as another record names it."""
        return dataclasses.replace(self, run_id=run_id)

    def incomplete_reason(self) -> str | None:
        """Why it is not complete (its manifest or a file it lists missing or cut), or None."""
        return incomplete_reason(self.path)

    def damaged_file(self) -> str | None:
        """The first file whose sha256 is not its manifest's, or None (a complete checkpoint)."""
        return damaged_file(self.path)

    def files(self, hashed: Sequence[Hashed] = ()) -> ModelFiles:
        """Its files verified and read without torch (config, heads, tokenizer, the weights' header)."""
        return read_model_files(self.path, hashed)

    def model(self, hashed: Sequence[Hashed] = ()) -> LoadedModel:
        """The model it holds (eval mode, CPU), its tokenizer and config.json."""
        return load_model(self.path, hashed)

    def train_state(self, mapped: bool = False) -> TrainState | None:
        """Its optimizer state, step and data positions (load_train_state), None where it has none."""
        return load_train_state(self.path, mapped)

    def sts_matrix(self, name: str = "") -> StsTransform | None:
        """Its tuned STS matrix `name` ("": the default one), verified with the folder; None where it has none."""
        from convsts.models.sts_transform import load_sts_transform  # torch

        return load_sts_transform(verified_folder(self.path), name)

    def embeddings_digest(self) -> str:
        """What its embeddings depend on (its weights and tokenizer), from its manifest's sha256."""
        return embeddings_digest(self.path)
