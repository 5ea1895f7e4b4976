"""Models from checkpoint folders and checkpoints from models: a checkpoint alone (tokenizer
included) encodes new text. The folder's layout and the checks every reader makes, which need no
torch, are convsts.models.checkpoint_files."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from convsts.datasets.text import save_tokenizer
from convsts.io import storage
from convsts.io.errors import BadInputError
from convsts.models.checkpoint_files import (
    FORMAT_VERSION,
    TRAIN_STATE_FILE,
    ModelFiles,
    checkpoint_folder,
    read_model_files,
    write_manifest,
)
from convsts.models.config import ModelConfig
from convsts.models.heads import MultitaskModel


def vocab_sizes(tokenizer) -> tuple[int, int]:
    """(num_words, num_bigrams) that the encoder's tables need for this tokenizer."""
    return tokenizer.num_words, getattr(tokenizer.config, "bigram_buckets", 1)


def build_model(config: ModelConfig, tokenizer, heads: dict[str, str] | None = None) -> MultitaskModel:
    """The encoder sized for `tokenizer`, with `heads` ({task: head kind}; default: the format-2 pair)."""
    num_words, num_bigrams = vocab_sizes(tokenizer)
    return MultitaskModel(config, num_words, num_bigrams, heads)


def save_checkpoint(
    path: str | Path,
    model: MultitaskModel,
    tokenizer,
    run_config: dict[str, Any] | None = None,
    train_state: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """`provenance`: what the weights were trained on (the prepared data's digests), checked on resume."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    # Serialized here and written by storage.write_bytes: a full disk is an OSError naming the file
    # (safetensors' and torch's own writers raise errors that do not say which file, or that it is space).
    storage.write_bytes(path / "model.safetensors", safetensors_bytes(state))
    save_tokenizer(tokenizer, path / "tokenizer.json")
    meta = {
        "format": FORMAT_VERSION,
        "model": dataclasses.asdict(model.config),
        "heads": model.head_kinds,
        "run_config": run_config or {},
        "provenance": provenance or {},
    }
    if train_state is not None and "step" in train_state:
        meta["step"] = int(train_state["step"])  # the training step of these weights, readable without torch.load
    storage.write_text(path / "config.json", json.dumps(meta, indent=2))
    if train_state is not None:
        buffer = io.BytesIO()
        torch.save(train_state, buffer)
        storage.write_bytes(path / TRAIN_STATE_FILE, buffer.getbuffer())
    write_manifest(path)
    return path


def _load_weights(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except Exception as err:  # safetensors raises its own SafetensorError for a file damaged since it was read
        raise BadInputError(
            f"{file}: not a readable safetensors file ({err}); the checkpoint is damaged or was cut short"
        ) from None


def load_model(path: str | Path) -> tuple[MultitaskModel, Any, dict[str, Any]]:
    """(model, tokenizer, meta) from a checkpoint or model folder (local or a URI), verified against
    its manifest and checked readable first (read_model_files); the model is in eval mode on CPU."""
    return model_from_files(read_model_files(path))


def model_from_files(files: ModelFiles) -> tuple[MultitaskModel, Any, dict[str, Any]]:
    """load_model's work once read_model_files has checked the folder: the tensors."""
    model = build_model(files.config, files.tokenizer, files.heads)
    weights = files.folder / "model.safetensors"
    try:
        model.load_state_dict(_load_weights(weights))
    except RuntimeError as err:  # shapes or names that do not match config.json
        raise BadInputError(
            f"{weights}: does not match {files.folder / 'config.json'} ({str(err).splitlines()[0]})"
        ) from None
    model.eval()
    return model, files.tokenizer, files.meta


def load_train_state(path: str | Path) -> dict[str, Any] | None:
    """A checkpoint's optimizer state, step and data position (tensors and plain values only: a
    pickle never runs), None where it has none; BadInputError for a damaged or foreign file."""
    file = checkpoint_folder(path) / TRAIN_STATE_FILE
    if not file.is_file():
        return None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # cut, corrupt, or holding objects weights_only refuses to build
        raise BadInputError(
            f"{file}: not a train state this version reads ({type(err).__name__}); the checkpoint is damaged "
            "or from another program"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise BadInputError(
            f"{file}: not a train state (no int 'step'); the checkpoint is damaged or from another program"
        )
    return state
