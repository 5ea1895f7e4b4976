"""Checkpoint and model folders as files, read without torch: their layout, the manifest every
reader checks, the config and tokenizer a folder records, and folders written whole.

Layout of a checkpoint folder:
  config.json        format version, model config (architecture dataclass), the resolved run config
  tokenizer.json     the tokenizer (convsts.datasets.text)
  model.safetensors  encoder + task heads (safe to load: no pickle)
  train_state.pt     optimizer state, step, data position (loaded with weights_only=True)
  manifest.json      written last: each file above with its size and sha256, checked by every reader
                     (verified_folder; a model folder has one too) (a checkpoint without
                     it, or with a file missing or of another size, is incomplete: an upload cut short)
  sts_transform.safetensors   optional: the tuned STS matrix written by `convsts evaluate`

A model folder (`save_model_folder`: what a training run hands to users, OUT/model, and what the
MLflow model holds) is the same minus train_state.pt, plus a model card (README.md); `load` reads
either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import shutil
import tempfile
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from safetensors import safe_open

from convsts.datasets.text import tokenizer_from_dict
from convsts.io import cache, storage
from convsts.io.errors import BadInputError
from convsts.io.redaction import redact
from convsts.models.config import ModelConfig

STS_PATTERN = "sts_transform*.safetensors"  # the tuned STS matrices (evaluate's and named ones)

FORMAT_VERSION = 2  # 2: the response head is residual (identity at init)
TRAIN_STATE_FILE = "train_state.pt"  # what a checkpoint adds to resume a run; a model folder has none
MANIFEST_FILE = "manifest.json"  # a checkpoint's files, sizes and digests, written last (incomplete_reason)


# No size of a model this program builds comes near it: a larger one in a config.json is damage, and
# is refused before a tensor of that size is allocated.
MAX_SIZE = 1 << 20
# The keys every checkpoint of this format has written (the others were added since, with defaults).
REQUIRED_MODEL_KEYS = ("encoder", "dan", "transformer", "response_hidden", "nli_hidden")


def model_config_from_dict(data: Any) -> ModelConfig:
    """A checkpoint's `model` section -> ModelConfig, every key and type checked and every size
    bounded before anything is built; ValueError naming the key (`model.dan.hidden_sizes[1]`)."""
    config = _dataclass_from(ModelConfig, data, "model", REQUIRED_MODEL_KEYS)
    config.check_sizes()  # the run config's rules: a checkpoint whose sizes no run would make is refused
    return config


def _dataclass_from(cls: type, data: Any, key: str, required: tuple[str, ...] = ()) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{key}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: not a key of {cls.__name__}")
    missing = [name for name in required if name not in data]
    if missing:
        raise ValueError(f"{key}.{missing[0]}: missing")
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a nested section (model.dan)
            values[name] = _dataclass_from(hint, value, f"{key}.{name}")
        else:
            _check_value(value, hint, f"{key}.{name}")
            values[name] = value
    return cls(**values)


def _check_value(value: Any, hint: Any, key: str) -> None:
    """`value` is of the annotated type (an int not a bool, a finite float, a list of ints, ...)
    and within MAX_SIZE; ValueError naming the key."""
    origin = typing.get_origin(hint)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{key}: expected a list, got {value!r}")
        for i, item in enumerate(value):
            _check_value(item, typing.get_args(hint)[0], f"{key}[{i}]")
        return
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
    if origin is dict:
        ok = isinstance(value, dict)
    elif hint in kinds:
        ok = isinstance(value, kinds[hint]) and (hint is bool or not isinstance(value, bool))
    else:
        ok = True  # Any
    if not ok:
        raise ValueError(f"{key}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or abs(value) > MAX_SIZE:
            raise ValueError(f"{key}: {value!r} is not a size a convsts model has (at most {MAX_SIZE})")


def write_manifest(path: Path, known: dict[str, dict[str, Any]] | None = None) -> None:
    """path/MANIFEST_FILE, after every other file of the checkpoint: their sizes and sha256 digests
    (`known`: entries of files copied from a checkpoint whose manifest holds them). The tuned STS
    matrices, written later by `convsts evaluate`, are not listed."""
    known = known or {}
    files = {
        f.name: known.get(f.name) or {"bytes": f.stat().st_size, "sha256": storage.file_sha256(f)}
        for f in sorted(path.iterdir())
        if f.is_file() and f.name != MANIFEST_FILE and not f.name.startswith(".") and not f.match(STS_PATTERN)
    }
    storage.write_text(path / MANIFEST_FILE, json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")


def _manifest(path: str | Path) -> dict[str, dict[str, Any]]:
    """The files a checkpoint's manifest lists ({name: {"bytes", "sha256"}}); BadInputError if damaged."""
    file = storage.join(path, MANIFEST_FILE)
    try:
        files = json.loads(storage.read_text(file))["files"]
        if all(isinstance(e["bytes"], int) and isinstance(e["sha256"], str) for e in files.values()):
            return files
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    raise BadInputError(f"{file}: not a checkpoint manifest; the checkpoint is damaged")


def incomplete_reason(path: str | Path) -> str | None:
    """Why the checkpoint folder at `path` (local or a URI: one listing, one small read) is not
    complete, or None when it is. Complete: its manifest, written last, is there, and every file it
    lists is there with the size it lists. A checkpoint whose upload or copy stopped midway lacks
    one or the other, whatever order its files were written in."""
    try:
        present = {name: size for name, size, _ in storage.folder_stats(path)}
    except FileNotFoundError:
        return "no such folder"
    except NotADirectoryError:
        return "not a folder"
    if MANIFEST_FILE not in present:
        return f"no {MANIFEST_FILE} (written last, once every file of the checkpoint is in place)"
    try:
        listed = _manifest(path)
    except BadInputError:
        return f"its {MANIFEST_FILE} is damaged"
    for name, entry in sorted(listed.items()):
        if name not in present:
            return f"{name} is missing"
        if present[name] != entry["bytes"]:
            return f"{name} has {present[name]:,} bytes, its manifest {entry['bytes']:,}"
    return None


def check_complete(path: str | Path) -> Path:
    """The checkpoint at `path` on this machine (checkpoint_folder), refused in one line unless it is
    complete and every file has its manifest's sha256 (a file damaged after it was written)."""
    reason = incomplete_reason(path)
    if reason is not None:
        raise BadInputError(f"{redact(str(path))}: not a complete checkpoint ({reason}); resume another")
    local = checkpoint_folder(path)
    _check_digests(local, path)
    return local


def verified_folder(path: str | Path) -> Path:
    """A checkpoint or model folder on this machine (checkpoint_folder), as every reader takes it:
    where it has a manifest, refused in one line unless each file it lists is there at its size
    (always) and with its sha256 (once per version of the files in a process: a folder read again
    unchanged is not hashed again). A folder without a manifest (made by hand) is read as it is."""
    local = checkpoint_folder(path)
    if not (local / MANIFEST_FILE).is_file():
        return local
    reason = incomplete_reason(local)
    if reason is not None:
        raise BadInputError(f"{redact(str(path))}: not a complete checkpoint or model folder ({reason})")
    _check_digests(local, path)
    return local


def _check_digests(local: Path, shown: str | Path) -> None:
    """Refused in one line naming `shown` unless every file the manifest lists has its sha256."""
    signature = tuple(
        (name, (local / name).stat().st_size, (local / name).stat().st_mtime_ns) for name in sorted(_manifest(local))
    )
    differs = _first_differing(local, signature)
    if differs is not None:
        raise BadInputError(
            f"{redact(str(shown))}: {differs} differs from its manifest's sha256 (replaced or damaged after it was "
            "written); refused"
        )


@functools.lru_cache(maxsize=64)  # per folder and version of its files (sizes and times): hashed once
def _first_differing(local: Path, signature: tuple[tuple[str, int, int], ...]) -> str | None:
    """The first listed file whose sha256 is not its manifest's, or None."""
    for name, entry in sorted(_manifest(local).items()):
        if storage.file_sha256(local / name) != entry["sha256"]:
            return name
    return None


MODEL_FILES = ("config.json", "tokenizer.json", "model.safetensors")  # + the STS matrices; not train_state.pt


def staging_folder(out_dir: Path) -> Path:
    """A new, empty folder beside out_dir, made by this call (a unique name: never a folder of the
    user's, which is never removed), to write into and rename into place when complete."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))


@contextlib.contextmanager
def replaced_whole(out_dir: Path) -> Iterator[Path]:
    """A folder written whole or not at all: the caller writes into a new staging folder beside
    `out_dir` (staging_folder), which then replaces `out_dir`; on any error it is removed (this call's
    own folder only) and `out_dir` stays as it was. An OSError without a file name (a full disk) names
    `out_dir`."""
    partial = staging_folder(out_dir)
    try:
        yield partial
    except BaseException as err:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(err, OSError) and not err.filename:
            raise OSError(err.errno, err.strerror or str(err), str(out_dir)) from err
        raise
    # Two renames, then the old copy removed: a signal between them puts the old one back, so
    # `out_dir` is the old folder or the new one, never neither.
    old = partial.with_suffix(".old") if out_dir.exists() else None
    try:
        if old is not None:
            out_dir.rename(old)
        partial.rename(out_dir)
    except BaseException:
        if old is not None and not out_dir.exists():
            old.rename(out_dir)
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old)


def save_model_folder(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """The encoder without optimizer state: MODEL_FILES (the STS matrix when present) copied from
    `checkpoint`; written beside `out_dir` and renamed into place, replacing an older copy."""
    checkpoint, out_dir = verified_folder(checkpoint), Path(out_dir)
    read_meta(checkpoint)  # a convsts checkpoint of this format
    known = _manifest(checkpoint) if (checkpoint / MANIFEST_FILE).is_file() else {}
    with replaced_whole(out_dir) as partial:
        for path in [*(checkpoint / n for n in MODEL_FILES), *sorted(checkpoint.glob(STS_PATTERN))]:
            if path.is_file():
                shutil.copy2(path, partial / path.name)
        write_manifest(partial, known)  # the model folder is verified as a checkpoint is
    return out_dir


def checkpoint_folder(path: str | Path) -> Path:
    """A checkpoint folder on this machine: `path`, or the files of a folder at a URI (s3://, gs://,
    ... as Ray Train keeps its checkpoints on a cluster) copied once into a local cache."""
    return cache.local_copy(str(path), "checkpoints") if storage.is_uri(path) else Path(path)


def read_meta(path: str | Path) -> dict[str, Any]:
    path = checkpoint_folder(path)
    config_file = path / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint folder")
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a convsts checkpoint: {config_file} is missing")
    meta = _read_json(config_file)
    if meta.get("format") != FORMAT_VERSION:
        raise BadInputError(f"{config_file}: unsupported checkpoint format {meta.get('format')!r}")
    return meta


def _read_json(file: Path) -> dict[str, Any]:
    try:
        value = json.loads(file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise BadInputError(f"{file}: not valid JSON ({err}); the checkpoint is damaged") from None
    if not isinstance(value, dict):
        raise BadInputError(f"{file}: expected a JSON object; the checkpoint is damaged")
    return value


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


def read_model_files(path: str | Path) -> ModelFiles:
    """The folder at `path` (local or a URI, verified_folder) checked readable without torch: a
    damaged or foreign folder is refused in one line naming the file, before a model is built (so a
    command refuses it before loading its libraries)."""
    folder = verified_folder(path)
    meta = read_meta(folder)
    tokenizer_data = _read_json(folder / "tokenizer.json")  # names the file when it is not JSON
    try:
        tokenizer = tokenizer_from_dict(tokenizer_data)
    except (ValueError, KeyError, TypeError) as err:  # an unknown kind or bigram hash, a missing field
        raise BadInputError(
            f"{folder / 'tokenizer.json'}: not a tokenizer this version reads ({err}); "
            "the checkpoint is damaged or from another program"
        ) from None
    try:
        config = model_config_from_dict(meta.get("model"))
    except ValueError as err:  # before any tensor of a size it names is allocated
        raise BadInputError(
            f"{folder / 'config.json'}: {err}; the checkpoint is damaged or from another program"
        ) from None
    heads = meta.get("heads")
    if not isinstance(heads, dict) or not heads:
        raise BadInputError(f"{folder / 'config.json'}: no task heads recorded; the checkpoint is damaged")
    _check_weights_header(folder / "model.safetensors")
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
