"""A verified checkpoint or model folder read without torch (its config, heads, tokenizer and the
weights' header), its parameter counts, and the model folder copied from a checkpoint."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from safetensors import safe_open

from convsts.datasets.text import tokenizer_from_dict
from convsts.io.errors import BadInputError
from convsts.io.folders import replaced_whole
from convsts.models.checkpoint.manifest import Hashed, listed_files, verified_folder, write_manifest
from convsts.models.checkpoint.names import (
    CONFIG_FILE,
    MODEL_FILES,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    model_config_from_dict,
    read_json_object,
    read_meta,
)
from convsts.models.config import ModelConfig


def parameter_counts(folder: str | Path) -> dict[str, int]:
    """{"encoder": n, "heads": n}: the parameters of a verified checkpoint or model folder on this
    machine, from its weights file's header (no tensor read)."""
    counts = {"encoder": 0, "heads": 0}
    with safe_open(str(Path(folder) / WEIGHTS_FILE), framework="pt") as f:
        for key in f.keys():
            n = 1
            for d in f.get_slice(key).get_shape():
                n *= d
            counts["encoder" if key.startswith("encoder.") else "heads"] += n
    return counts


def save_model_folder(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """The encoder without optimizer state: MODEL_FILES (the STS matrix when present) copied from
    `checkpoint`; written beside `out_dir` and renamed into place, replacing an older copy."""
    from convsts.models.sts_transform import FILE_PATTERN as STS_FILES  # the matrices' own names (torch)

    checkpoint, out_dir = verified_folder(checkpoint), Path(out_dir)
    read_meta(checkpoint)  # a convsts checkpoint of this format
    known = listed_files(checkpoint)
    with replaced_whole(out_dir) as partial:
        for path in [*(checkpoint / n for n in MODEL_FILES), *sorted(checkpoint.glob(STS_FILES))]:
            if path.is_file():
                shutil.copy2(path, partial / path.name)
        write_manifest(partial, known)  # the model folder is verified as a checkpoint is
    return out_dir


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    """A checkpoint or model folder on this machine whose files read: verified against its manifest,
    its config, task heads and tokenizer parsed, its weights' safetensors header whole. What is left to
    load is the tensors (convsts.models.checkpoint.model_from_files)."""

    folder: Path
    meta: dict[str, Any]  # config.json
    config: ModelConfig
    heads: dict[str, str]  # {task: head kind}
    tokenizer: Any


def read_model_files(path: str | Path, hashed: Sequence[Hashed] = ()) -> ModelFiles:
    """The folder at `path` (local or a URI, verified_folder) checked readable without torch: a
    damaged or foreign folder is refused in one line naming the file, before a model is built (so a
    command refuses it before loading its libraries)."""
    folder = verified_folder(path, hashed)
    meta = read_meta(folder)
    tokenizer_data = read_json_object(folder / TOKENIZER_FILE)  # names the file when it is not JSON
    try:
        tokenizer = tokenizer_from_dict(tokenizer_data)
    except (ValueError, KeyError, TypeError) as err:  # an unknown kind or bigram hash, a missing field
        raise BadInputError(
            f"{folder / TOKENIZER_FILE}: not a tokenizer this version reads ({err}); "
            "the checkpoint is damaged or from another program"
        ) from None
    try:
        config = model_config_from_dict(meta.get("model"))
    except ValueError as err:  # before any tensor of a size it names is allocated
        raise BadInputError(
            f"{folder / CONFIG_FILE}: {err}; the checkpoint is damaged or from another program"
        ) from None
    heads = meta.get("heads")
    if not isinstance(heads, dict) or not heads:
        raise BadInputError(f"{folder / CONFIG_FILE}: no task heads recorded; the checkpoint is damaged")
    _check_weights_header(folder / WEIGHTS_FILE)
    return ModelFiles(folder, meta, config, heads, tokenizer)


def _check_weights_header(file: Path) -> None:
    """The safetensors file's header parses and covers the file (one cut short does not)."""
    if not file.is_file():
        raise FileNotFoundError(f"{file.parent} is not a complete checkpoint: {file.name} is missing")
    try:
        with safe_open(str(file), framework="numpy"):
            pass
    except Exception as err:  # safetensors raises its own SafetensorError for a cut or corrupt file
        raise BadInputError(
            f"{file}: not a readable safetensors file ({err}); the checkpoint is damaged or was cut short"
        ) from None
