"""The checkpoint: the one component that knows a checkpoint folder's layout (this package: its names,
its manifest, its files read without torch, its tensors, and `Checkpoint`, the type every reader
takes). It writes one (manifest last), lists the complete ones of a run folder (local or a bucket
prefix) newest by step, verifies one against its manifest, reads its metadata without torch, and
loads its weights into a model. Nothing else in convsts names a checkpoint's files
(tests/cli/test_layering.py checks it).

Layout of a checkpoint folder, `checkpoint-<step>` in a run's folder (Ray Train's checkpoint_dir_name):
  config.json        format version, step, model config (architecture dataclass), task heads, the
                     resolved run config, provenance (the data digests, the MLflow run that wrote it)
  tokenizer.json     the tokenizer (convsts.datasets.text)
  model.safetensors  encoder + task heads (safe to load: no pickle)
  train_state.pt     TrainState: optimizer state, step, data positions, every rank's RNG (weights_only=True)
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

from convsts.models.checkpoint.checkpoint import Checkpoint
from convsts.models.checkpoint.listing import complete_checkpoints, listed_steps, newest_complete
from convsts.models.checkpoint.manifest import (
    Hashed,
    add_to_manifest,
    damaged_file,
    embeddings_digest,
    hashed_here,
    incomplete_reason,
    listed_files,
    save_sts_matrix,
    verified_folder,
    write_manifest,
)
from convsts.models.checkpoint.names import (
    CONFIG_FILE,
    EMBEDDING_FILES,
    FOLDER_NAME,
    FOLDER_PREFIX,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MAX_SIZE,
    MODEL_FILES,
    REQUIRED_MODEL_KEYS,
    TOKENIZER_FILE,
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    checkpoint_folder,
    folder_name,
    model_config_from_dict,
    read_json_object,
    read_meta,
)
from convsts.models.checkpoint.reading import ModelFiles, parameter_counts, read_model_files, save_model_folder
from convsts.models.checkpoint.tensors import (
    HeadChanges,
    LoadedModel,
    build_model,
    head_changes,
    load_model,
    load_train_state,
    load_weights,
    model_from_files,
    save_checkpoint,
    vocab_sizes,
)
from convsts.models.checkpoint.train_state import TrainState

__all__ = [
    "CONFIG_FILE",
    "Checkpoint",
    "EMBEDDING_FILES",
    "FOLDER_NAME",
    "FOLDER_PREFIX",
    "FORMAT_VERSION",
    "Hashed",
    "HeadChanges",
    "LoadedModel",
    "MANIFEST_FILE",
    "MAX_SIZE",
    "MODEL_FILES",
    "ModelFiles",
    "REQUIRED_MODEL_KEYS",
    "TOKENIZER_FILE",
    "TRAIN_STATE_FILE",
    "TrainState",
    "WEIGHTS_FILE",
    "add_to_manifest",
    "build_model",
    "checkpoint_folder",
    "complete_checkpoints",
    "damaged_file",
    "embeddings_digest",
    "folder_name",
    "hashed_here",
    "head_changes",
    "incomplete_reason",
    "listed_files",
    "listed_steps",
    "load_model",
    "load_train_state",
    "load_weights",
    "model_config_from_dict",
    "model_from_files",
    "newest_complete",
    "parameter_counts",
    "read_json_object",
    "read_meta",
    "read_model_files",
    "save_checkpoint",
    "save_model_folder",
    "save_sts_matrix",
    "verified_folder",
    "vocab_sizes",
    "write_manifest",
]
