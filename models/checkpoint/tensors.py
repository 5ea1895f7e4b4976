"""A checkpoint's tensors (torch imported where used): the model built for a tokenizer, a checkpoint
saved, its weights and train state loaded."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from convsts.datasets.text import save_tokenizer
from convsts.io import storage
from convsts.io.errors import BadInputError
from convsts.models.checkpoint.manifest import Hashed, write_manifest
from convsts.models.checkpoint.names import (
    CONFIG_FILE,
    FORMAT_VERSION,
    TOKENIZER_FILE,
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    checkpoint_folder,
)
from convsts.models.checkpoint.reading import ModelFiles, read_model_files
from convsts.models.checkpoint.train_state import TrainState
from convsts.models.config import ModelConfig

if TYPE_CHECKING:
    import torch

    from convsts.models.heads import MultitaskModel


class HeadChanges(NamedTuple):
    """How a checkpoint's task heads differ from the heads of a model its weights go into."""

    fresh: list[str]  # the model's heads the checkpoint lacks: they keep their initial weights
    dropped: list[str]  # the checkpoint's heads the model has no task for: not loaded
    other_kind: list[str]  # "task: kind (checkpoint: kind)" where a task's head is of another kind


def head_changes(checkpoint_heads: dict[str, str], model_heads: dict[str, str]) -> HeadChanges:
    return HeadChanges(
        [t for t in model_heads if t not in checkpoint_heads],
        [t for t in checkpoint_heads if t not in model_heads],
        [
            f"{t}: {model_heads[t]} (checkpoint: {checkpoint_heads[t]})"
            for t in model_heads
            if t in checkpoint_heads and checkpoint_heads[t] != model_heads[t]
        ],
    )


def vocab_sizes(tokenizer) -> tuple[int, int]:
    """(num_words, num_bigrams) that the encoder's tables need for this tokenizer."""
    return tokenizer.num_words, getattr(tokenizer.config, "bigram_buckets", 1)


def build_model(config: ModelConfig, tokenizer, heads: dict[str, str] | None = None) -> MultitaskModel:
    """The encoder sized for `tokenizer`, with `heads` ({task: head kind}; default: the format-2 pair)."""
    from convsts.models.heads import MultitaskModel

    num_words, num_bigrams = vocab_sizes(tokenizer)
    return MultitaskModel(config, num_words, num_bigrams, heads)


def save_checkpoint(
    path: str | Path,
    model: MultitaskModel,
    tokenizer,
    run_config: dict[str, Any] | None = None,
    train_state: TrainState | None = None,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """A checkpoint folder at `path`: weights, tokenizer, config.json (with the step of
    `train_state`), the train state, and the manifest last. `provenance`: what the weights were
    trained on (the prepared data's digests) and the MLflow run that wrote them, checked on resume."""
    import torch
    from safetensors.torch import save as safetensors_bytes

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    # Serialized here and written by storage.write_bytes: a full disk is an OSError naming the file
    # (safetensors' and torch's own writers raise errors that do not say which file, or that it is space).
    storage.write_bytes(path / WEIGHTS_FILE, safetensors_bytes(state))
    save_tokenizer(tokenizer, path / TOKENIZER_FILE)
    meta = {
        "format": FORMAT_VERSION,
        "step": train_state.step if train_state is not None else 0,
        "model": dataclasses.asdict(model.config),
        "heads": model.head_kinds,
        "run_config": run_config or {},
        "provenance": provenance or {},
    }
    storage.write_text(path / CONFIG_FILE, json.dumps(meta, indent=2))
    if train_state is not None:
        buffer = io.BytesIO()
        torch.save(train_state.to_dict(), buffer)
        storage.write_bytes(path / TRAIN_STATE_FILE, buffer.getbuffer())
    write_manifest(path)
    return path


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except Exception as err:  # safetensors raises its own SafetensorError for a file damaged since it was read
        raise BadInputError(
            f"{file}: not a readable safetensors file ({err}); the checkpoint is damaged or was cut short"
        ) from None


class LoadedModel(NamedTuple):
    """A checkpoint or model folder loaded: the model (eval mode, CPU), its tokenizer, its config.json."""

    model: MultitaskModel
    tokenizer: Any
    meta: dict[str, Any]


def load_model(path: str | Path, hashed: Sequence[Hashed] = ()) -> LoadedModel:
    """(model, tokenizer, meta) from a checkpoint or model folder (local or a URI), verified against
    its manifest and checked readable first (read_model_files); the model is in eval mode on CPU."""
    return model_from_files(read_model_files(path, hashed))


def model_from_files(files: ModelFiles) -> LoadedModel:
    """load_model's work once read_model_files has checked the folder: the tensors."""
    model = build_model(files.config, files.tokenizer, files.heads)
    weights = files.folder / WEIGHTS_FILE
    try:
        model.load_state_dict(_read_weights(weights))
    except RuntimeError as err:  # shapes or names that do not match config.json
        raise BadInputError(
            f"{weights}: does not match {files.folder / CONFIG_FILE} ({str(err).splitlines()[0]})"
        ) from None
    model.eval()
    return LoadedModel(model, files.tokenizer, files.meta)


def load_weights(model: MultitaskModel, path: str | Path, hashed: Sequence[Hashed] = ()) -> HeadChanges:
    """The checkpoint's weights loaded into `model` (a run's model resuming it): the encoder and each
    head the two share. A head the checkpoint lacks (a built-in task added since it was written)
    keeps its initial weights, one the model has no task for is not loaded; a head of another kind
    is refused (the driver refuses it first, in one line: resume_mismatches)."""
    files = read_model_files(path, hashed)
    changes = head_changes(files.heads, model.head_kinds)
    weights = files.folder / WEIGHTS_FILE
    if changes.other_kind:
        raise BadInputError(f"{weights}: task heads of another kind ({'; '.join(changes.other_kind)})")
    dropped = tuple(f"heads.{t}." for t in changes.dropped)
    fresh = tuple(f"heads.{t}." for t in changes.fresh)
    state = {k: v for k, v in _read_weights(weights).items() if not k.startswith(dropped)}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # a shape that differs
        raise BadInputError(f"{weights}: does not match this run's model ({str(err).splitlines()[0]})") from None
    wrong = [k for k in missing if not k.startswith(fresh)] + list(unexpected)
    if wrong:
        raise BadInputError(f"{weights}: does not match this run's model ({wrong[0]} missing or unexpected)")
    return changes


def load_train_state(path: str | Path, mapped: bool = False) -> TrainState | None:
    """A checkpoint's optimizer state, step and data position (tensors and plain values only: a
    pickle never runs), None where it has none; BadInputError for a damaged or foreign file.
    `mapped`: its tensors mapped from the file, read only where used (a check of it reads none: an
    optimizer state can be gigabytes)."""
    import torch

    file = checkpoint_folder(path) / TRAIN_STATE_FILE
    if not file.is_file():
        return None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=mapped)
    except Exception as err:  # cut, corrupt, or holding objects weights_only refuses to build
        raise BadInputError(
            f"{file}: not a train state this version reads ({type(err).__name__}); the checkpoint is damaged "
            "or from another program"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise BadInputError(
            f"{file}: not a train state (no int 'step'); the checkpoint is damaged or from another program"
        )
    return TrainState.from_dict(state)
