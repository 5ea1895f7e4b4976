"""A checkpoint folder's names (its files, `checkpoint-<step>`), its config.json read without torch, and
a folder at a URI copied to this machine."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from convsts.io import cache, storage
from convsts.io.errors import BadInputError
from convsts.io.typed_json import dataclass_from_json
from convsts.models.config import ModelConfig

CONFIG_FILE = "config.json"

TOKENIZER_FILE = "tokenizer.json"

WEIGHTS_FILE = "model.safetensors"

FORMAT_VERSION = 2  # 2: the response head is residual (identity at init)

TRAIN_STATE_FILE = "train_state.pt"  # what a checkpoint adds to resume a run; a model folder has none

MANIFEST_FILE = "manifest.json"  # a checkpoint's files, sizes and digests, written last (incomplete_reason)

MODEL_FILES = (CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE)  # a model folder's (+ the STS matrices); no train state

EMBEDDING_FILES = (WEIGHTS_FILE, TOKENIZER_FILE)  # what a checkpoint's embeddings depend on

FOLDER_PREFIX = "checkpoint-"  # a run's checkpoints: checkpoint-<step> (HF Trainer's names), step readable

FOLDER_NAME = re.compile(r"checkpoint-(\d+)")

# No size of a model this program builds comes near it: a larger one in a config.json is damage, and
# is refused before a tensor of that size is allocated.
MAX_SIZE = 1 << 20

# The keys every checkpoint of this format has written (the others were added since, with defaults).
REQUIRED_MODEL_KEYS = ("encoder", "dan", "transformer", "response_hidden", "nli_hidden")


def model_config_from_dict(data: Any) -> ModelConfig:
    """A checkpoint's `model` section -> ModelConfig, every key and type checked and every size
    bounded before anything is built; ValueError naming the key (`model.dan.hidden_sizes[1]`)."""
    config = dataclass_from_json(ModelConfig, data, "model", REQUIRED_MODEL_KEYS, MAX_SIZE)
    config.check_sizes()  # the run config's rules: a checkpoint whose sizes no run would make is refused
    return config


def folder_name(step: int) -> str:
    """The folder a run's checkpoint of `step` is reported as (ray.train.report's checkpoint_dir_name)."""
    return f"{FOLDER_PREFIX}{step}"


def checkpoint_folder(path: str | Path) -> Path:
    """A checkpoint folder on this machine: `path`, or the files of a folder at a URI (s3://, gs://,
    ... as Ray Train keeps its checkpoints on a cluster) copied once into a local cache."""
    return cache.local_copy(str(path), "checkpoints") if storage.is_uri(path) else Path(path)


def read_meta(path: str | Path) -> dict[str, Any]:
    path = checkpoint_folder(path)
    config_file = path / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint folder")
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a convsts checkpoint: {config_file} is missing")
    meta = read_json_object(config_file)
    if meta.get("format") != FORMAT_VERSION:
        raise BadInputError(f"{config_file}: unsupported checkpoint format {meta.get('format')!r}")
    return meta


def read_json_object(file: Path) -> dict[str, Any]:
    try:
        value = json.loads(file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise BadInputError(f"{file}: not valid JSON ({err}); the checkpoint is damaged") from None
    if not isinstance(value, dict):
        raise BadInputError(f"{file}: expected a JSON object; the checkpoint is damaged")
    return value
