"""The checkpoint: the one component that knows a checkpoint folder's layout. It writes one (manifest
last), lists the complete ones of a run folder (local or a bucket prefix) newest by step, verifies one
against its manifest, reads its metadata without torch, and loads its weights into a model. Nothing
else in convsts names a checkpoint's files (tests/cli/test_layering.py checks it).

Layout of a checkpoint folder, `checkpoint-<step>` in a run's folder (Ray Train's checkpoint_dir_name):
  config.json        format version, step, model config (architecture dataclass), task heads, the
                     resolved run config, provenance (the data digests, the MLflow run that wrote it)
  tokenizer.json     the tokenizer (convsts.datasets.text)
  model.safetensors  encoder + task heads (safe to load: no pickle)
  train_state.pt     optimizer state, step, data positions, every rank's RNG (weights_only=True)
  sts_transform*.safetensors   optional: tuned STS matrices (`convsts evaluate`, a sweep); listed in
                     the manifest once written (add_to_manifest)
  manifest.json      written last: each file above with its size and sha256. Every reader requires it
                     (verified_folder): a folder without one, or with a file missing or of another
                     size, is incomplete (an upload cut short); one whose file differs from its sha256
                     is damaged.

A model folder (`save_model_folder`: what a training run hands to users, OUT/model, and what the
MLflow model holds) is the same minus train_state.pt, plus a model card (README.md); `load` reads
either. torch is imported by the functions that build or load tensors, so a command checks a folder
(read_model_files) before loading it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import logging
import re
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from safetensors import safe_open

from convsts.datasets.text import save_tokenizer, tokenizer_from_dict
from convsts.io import cache, storage
from convsts.io.errors import BadInputError
from convsts.io.folders import replaced_whole
from convsts.io.redaction import redact
from convsts.io.typed_json import dataclass_from_json
from convsts.models.config import ModelConfig

if TYPE_CHECKING:
    import torch

    from convsts.models.heads import MultitaskModel
    from convsts.models.sts_transform import StsTransform

log = logging.getLogger("convsts")

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


def write_manifest(path: Path, known: dict[str, dict[str, Any]] | None = None) -> None:
    """path/MANIFEST_FILE, after every other file of the checkpoint: their sizes and sha256 digests
    (`known`: entries of files copied from a checkpoint whose manifest holds them). The tuned STS
    matrices written later are added by add_to_manifest."""
    known = known or {}
    files = {
        f.name: known.get(f.name) or _manifest_entry(f)
        for f in sorted(path.iterdir())
        if f.is_file() and f.name != MANIFEST_FILE and not f.name.startswith(".")
    }
    _write_manifest_files(path, files)


def _manifest_entry(file: Path) -> dict[str, Any]:
    return {"bytes": file.stat().st_size, "sha256": storage.file_sha256(file)}


def _write_manifest_files(path: Path, files: dict[str, dict[str, Any]]) -> None:
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


def save_sts_matrix(folder: str | Path, transform: StsTransform, name: str = "") -> Path:
    """A tuned STS matrix saved into `folder` (a checkpoint, a model folder or an evaluation's
    output); in a checkpoint or model folder it joins the manifest, so every reader verifies it."""
    path = transform.save(folder, name)
    if (Path(folder) / MANIFEST_FILE).is_file():
        add_to_manifest(folder, path)
    return path


class Hashed(NamedTuple):
    """A checkpoint or model folder that one process hashed against its manifest: its machine, its
    local folder and its files' sizes and times then. Another process on that machine, given it,
    does not hash the same files again while they keep those sizes and times (a Ray Train worker
    after its driver's checks)."""

    host: str
    folder: str
    signature: tuple[tuple[str, int, int], ...]

    def covers(self, local: Path) -> bool:
        return self.host == socket.gethostname() and self.folder == str(local) and self.signature == _signature(local)


def hashed_here(path: str | Path) -> Hashed:
    """The folder at `path` verified (verified_folder: hashed once in this process), as a Hashed to
    hand to another process on this machine."""
    local = verified_folder(path)
    return Hashed(socket.gethostname(), str(local), _signature(local))


def verified_folder(path: str | Path, hashed: Sequence[Hashed] = ()) -> Path:
    """A checkpoint or model folder on this machine (checkpoint_folder), as every reader takes it:
    refused in one line unless its manifest is there and each file it lists is there at its size
    (always) and with its sha256 (once per version of the files in a process: a folder read again
    unchanged is not hashed again; nor one that another process on this machine hashed, `hashed`,
    unchanged since). A folder without a manifest is refused: nothing tells a whole folder from one
    cut short."""
    local = checkpoint_folder(path)  # a folder at a URI is read once, into the local cache
    reason = incomplete_reason(local)
    if reason is not None:
        raise BadInputError(f"{redact(str(path))}: not a complete checkpoint or model folder ({reason})")
    if not any(h.covers(local) for h in hashed):
        _check_digests(local, path)
    return local


def add_to_manifest(folder: str | Path, file: Path) -> None:
    """`file`, just written into the verified local `folder` (a tuned STS matrix), listed in its
    manifest beside the entries it had, so every later read verifies it too."""
    _write_manifest_files(Path(folder), _manifest(folder) | {file.name: _manifest_entry(file)})


def damaged_file(path: str | Path) -> str | None:
    """The first file of a complete checkpoint or model folder (incomplete_reason None) whose sha256
    is not its manifest's (replaced or damaged after it was written), or None; hashed as
    verified_folder hashes it, so that reading the folder next hashes nothing again."""
    local = checkpoint_folder(path)
    return _first_differing(local, _signature(local))


def _signature(local: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple(
        (name, (local / name).stat().st_size, (local / name).stat().st_mtime_ns) for name in sorted(_manifest(local))
    )


def _check_digests(local: Path, shown: str | Path) -> None:
    """Refused in one line naming `shown` unless every file the manifest lists has its sha256."""
    differs = _first_differing(local, _signature(local))
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


def embeddings_digest(path: str | Path) -> str:
    """A digest of what a checkpoint's embeddings depend on (EMBEDDING_FILES: its weights and
    tokenizer), from the sha256 its manifest lists for each (verified_folder checked them): equal for
    two folders whose those files are equal, read without reading the files again."""
    listed = _manifest(verified_folder(path))
    return hashlib.sha1("".join(listed[name]["sha256"] for name in EMBEDDING_FILES).encode()).hexdigest()


def save_model_folder(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """The encoder without optimizer state: MODEL_FILES (the STS matrix when present) copied from
    `checkpoint`; written beside `out_dir` and renamed into place, replacing an older copy."""
    from convsts.models.sts_transform import FILE_PATTERN as STS_FILES  # the matrices' own names (torch)

    checkpoint, out_dir = verified_folder(checkpoint), Path(out_dir)
    read_meta(checkpoint)  # a convsts checkpoint of this format
    known = _manifest(checkpoint)
    with replaced_whole(out_dir) as partial:
        for path in [*(checkpoint / n for n in MODEL_FILES), *sorted(checkpoint.glob(STS_FILES))]:
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
    config_file = path / CONFIG_FILE
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


def read_model_files(path: str | Path, hashed: Sequence[Hashed] = ()) -> ModelFiles:
    """The folder at `path` (local or a URI, verified_folder) checked readable without torch: a
    damaged or foreign folder is refused in one line naming the file, before a model is built (so a
    command refuses it before loading its libraries)."""
    folder = verified_folder(path, hashed)
    meta = read_meta(folder)
    tokenizer_data = _read_json(folder / TOKENIZER_FILE)  # names the file when it is not JSON
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


# ---------------------------------------------------------------------------------------------
# A run's checkpoints: named by step, listed newest first


def folder_name(step: int) -> str:
    """The folder a run's checkpoint of `step` is reported as (ray.train.report's checkpoint_dir_name)."""
    return f"{FOLDER_PREFIX}{step}"


class CheckpointRef(NamedTuple):
    """A checkpoint: where it is and its step; the MLflow run that wrote it, where that was read (its
    config.json: checkpoint_owner) and it was written inside a training run; the run's checkpoint
    folder it was listed in (listed_steps), where it was."""

    path: str
    step: int
    run_id: str | None = None
    folder: str | None = None


def listed_steps(folder: str) -> list[CheckpointRef]:
    """The checkpoint-<step> folders in `folder` (local or a URI: one listing), newest step first,
    complete or not; [] where the folder is not there."""
    try:
        names = storage.entry_names(folder)
    except FileNotFoundError:
        return []
    found = [
        CheckpointRef(storage.join(folder, n), int(m.group(1)), folder=folder)
        for n in names
        if (m := FOLDER_NAME.fullmatch(n))
    ]
    return sorted(found, key=lambda c: c.step, reverse=True)


def complete_checkpoints(folder: str, newest_only: bool = False, below: int | None = None) -> list[CheckpointRef]:
    """The complete checkpoints in `folder` (those of a step below `below`, where given), newest step
    first (`newest_only`: the first of them); each incomplete one met on the way (an upload that
    stopped midway) is left out with one line."""
    kept = []
    for candidate in listed_steps(folder):
        if below is not None and candidate.step >= below:
            continue
        reason = incomplete_reason(candidate.path)
        if reason is not None:
            log.warning("%s: skipped, not a complete checkpoint (%s)", redact(candidate.path), reason)
            continue
        kept.append(candidate)
        if newest_only:
            break
    return kept


def newest_complete(folder: str) -> CheckpointRef | None:
    """The newest complete checkpoint in `folder` by step, or None."""
    kept = complete_checkpoints(folder, newest_only=True)
    return kept[0] if kept else None


def checkpoint_owner(path: str | Path) -> CheckpointRef:
    """The checkpoint at `path` with the step and writing run its config.json names (local or a URI:
    one small read); BadInputError naming the file where it is missing, not JSON or without an int step."""
    file = storage.join(str(path), CONFIG_FILE)
    try:
        meta = json.loads(storage.read_text(file))
        step, provenance = meta["step"], meta.get("provenance") or {}
        run_id = provenance.get("run_id")
        if isinstance(step, int) and not isinstance(step, bool) and (run_id is None or isinstance(run_id, str)):
            return CheckpointRef(str(path), step, run_id)
        reason = "its step or run_id is not of the type convsts writes"
    except FileNotFoundError:
        reason = "missing"
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        reason = f"not a checkpoint's config ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    raise BadInputError(f"{redact(file)}: {reason}; the checkpoint is damaged")


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


# ---------------------------------------------------------------------------------------------
# Tensors (torch imported here: reading a folder's files needs none)


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
    train_state: dict[str, Any] | None = None,
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
        "step": int(train_state["step"]) if train_state is not None and "step" in train_state else 0,
        "model": dataclasses.asdict(model.config),
        "heads": model.head_kinds,
        "run_config": run_config or {},
        "provenance": provenance or {},
    }
    storage.write_text(path / CONFIG_FILE, json.dumps(meta, indent=2))
    if train_state is not None:
        buffer = io.BytesIO()
        torch.save(train_state, buffer)
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


def load_train_state(path: str | Path, mapped: bool = False) -> dict[str, Any] | None:
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
    return state
