"""The checks before a training run: where its prepared data is and what it digests to, and whether
the checkpoint it resumes or warm-starts from fits this run (model, tokenizer, tasks, heads, data),
each refusal one line."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from convsts.io import storage
from convsts.io.dotted import changed_values, flatten
from convsts.io.errors import ConfigError
from convsts.io.redaction import redact, redact_tree
from convsts.io.storage import resolve_path
from convsts.models.checkpoint import CONFIG_FILE as CHECKPOINT_CONFIG
from convsts.models.checkpoint import (
    build_model,
    head_changes,
    load_model,
    load_train_state,
    read_meta,
    verified_folder,
)
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.tasks import model_heads


def prepared_location(cfg: RunConfig, out_dir: str | Path, given: str | Path | None = None) -> str:
    """Prepared shards: `given` (--prepared), else data.prepared_dir, else <out>/prepared; local or a URI."""
    location = str(given or resolve_path(cfg.data.prepared_dir) or RunFolder(Path(out_dir)).prepared)
    return location if storage.is_uri(location) else str(Path(location).resolve())


def data_digests(manifests: dict[str, dict[str, Any]]) -> dict[str, str]:
    """{task: sha1 of its verified manifest's shard list (names, rows, sizes, sha256)}: what a run
    trained on; a shard replaced by other rows changes it."""
    return {
        name: hashlib.sha1(json.dumps(m["shards"], sort_keys=True).encode()).hexdigest()
        for name, m in manifests.items()
    }


def resume_mismatches(meta: dict[str, Any], cfg: RunConfig) -> list[str]:
    """What differs between a checkpoint (its config.json, `meta`) and the run that would resume
    it: the model, the tokenizer settings, the tasks, a task head of another kind. A built-in head
    the checkpoint lacks is not a difference: it starts fresh (said by check_resumable)."""
    old = meta.get("run_config", {})
    new = redact_tree(cfg.to_dict())  # the checkpoint's copy is redacted
    out = []
    for section in ("model", "tokenizer"):  # a setting added since the checkpoint was written is not a difference
        out += changed_values(
            flatten(old.get(section, {}), f"{section}."),
            flatten(new[section], f"{section}."),
            "this run",
            new_keys=False,
        )
    if sorted(old.get("trainer", {}).get("task_weights", {})) != sorted(cfg.trainer.task_weights):
        out.append(f"tasks={sorted(old['trainer']['task_weights'])} (this run: {sorted(cfg.trainer.task_weights)})")
    out += [f"the {d}" for d in head_changes(meta.get("heads") or {}, model_heads(cfg)).other_kind]
    return out


# What a resume may change without a word: where the checkpoint comes from and where the run logs.
RESUME_UNSAID = ("trainer.resume_from", "trainer.warm_start", "mlflow.")


def other_settings(meta: dict[str, Any], cfg: RunConfig, leaving_out: tuple[str, ...] = ()) -> list[str]:
    """The settings outside resume_mismatches' checks in which this run differs from the run that
    wrote the checkpoint (its config.json, `meta`: a batch size, a learning rate, trainer.steps):
    taken, and named; the keys `leaving_out` not among them."""
    old = flatten(meta.get("run_config", {}))
    new = flatten(redact_tree(cfg.to_dict()))  # the checkpoint's copy is redacted
    checked = ("model.", "tokenizer.", "trainer.task_weights.", *RESUME_UNSAID)
    keep = {k for k in old.keys() & new.keys() if not k.startswith(checked) and k not in leaving_out}
    return changed_values({k: old[k] for k in keep}, {k: new[k] for k in keep}, "this run")


def data_mismatches(meta: dict[str, Any], digests: dict[str, str]) -> list[str]:
    """The prepared data of the run that would resume a checkpoint (its config.json, `meta`), where
    it differs from the data the checkpoint was trained on."""
    trained_on = meta.get("provenance", {}).get("data", {})
    return [
        f"the prepared {task} data differs from the data the checkpoint was trained on"
        for task, digest in digests.items()
        if task in trained_on and trained_on[task] != digest
    ]


# Settings that say what a run is called, where its outputs go and when it saves or evaluates, never
# what a step computes; trainer.steps too where the lr does not decay toward it.
TRAJECTORY_NEUTRAL = (
    "name",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoints",
    "trainer.max_failures",
    "trainer.storage_path",
    "trainer.eval_every",
    "data.prepared_dir",
    "trainer.feed",  # either feed gives the same batches
    "trainer.feed_processes",
)


def new_trajectory(meta: dict[str, Any], cfg: RunConfig) -> list[str]:
    """The other_settings under which the steps after the checkpoint (its config.json, `meta`) are
    not the ones its chain logged (all but TRAJECTORY_NEUTRAL's)."""
    neutral = TRAJECTORY_NEUTRAL + (("trainer.steps",) if cfg.trainer.lr_decay == "none" else ())
    return other_settings(meta, cfg, leaving_out=neutral)


def history_until(cfg: RunConfig) -> int | None:
    """Where a resume with a new trajectory (new_trajectory) leaves its chain's history: its
    checkpoint's step. The steps the chain logged after it are superseded, the run logs its own.
    None for a run that starts fresh or goes on as its checkpoint's run would have."""
    if not cfg.trainer.resume_from:
        return None
    meta = read_meta(verified_folder(cfg.trainer.resume_from))  # verified once (check_resumable): not hashed again
    return meta["step"] if new_trajectory(meta, cfg) else None


def check_initial_weights(cfg: RunConfig) -> None:
    """The checkpoint a run resumes or warm-starts from, checked here, once, in one line, not in
    every worker after Ray has started (the prepared data is compared later: check_resume_data)."""
    if cfg.trainer.resume_from:
        check_resumable(cfg)
    elif cfg.trainer.warm_start:
        check_warm_start(cfg)


def check_warm_start(cfg: RunConfig) -> None:
    """trainer.warm_start's encoder fits this run's model (the same encoder, every tensor the same
    shape), as every worker will load it."""
    warm = load_model(cfg.trainer.warm_start)
    theirs, ours = warm.meta.get("model", {}).get("encoder"), cfg.model.encoder
    where = f"trainer.warm_start: {redact(cfg.trainer.warm_start)}"
    if theirs != ours:
        raise ConfigError(
            f"{where} holds a {theirs} encoder; this run's model.encoder is {ours}: warm-start from a {ours} checkpoint"
        )
    mine = build_model(copy.deepcopy(cfg.model), warm.tokenizer).encoder.state_dict()  # building fills hf_config
    for name, tensor in warm.model.encoder.state_dict().items():
        if name not in mine or mine[name].shape != tensor.shape:
            shape = tuple(mine[name].shape) if name in mine else "no such tensor"
            raise ConfigError(
                f"{where}: its encoder's {name} is {tuple(tensor.shape)}, this run's model makes {shape}; "
                f"set model.{ours}.* as the checkpoint's {CHECKPOINT_CONFIG} has them"
            )


def check_resumable(cfg: RunConfig) -> None:
    """The checkpoint to resume, refused in one line unless it is complete and verified (not an
    upload that stopped midway), of this run's model, tokenizer, tasks and head kinds, and its train
    state readable. A head this run's model has that the checkpoint lacks is one line: it starts
    fresh."""
    checkpoint = cfg.trainer.resume_from
    meta = read_meta(verified_folder(checkpoint))  # read once, from the verified local copy
    differs = resume_mismatches(meta, cfg)
    if differs:
        raise ConfigError(f"cannot resume {redact(checkpoint)}: " + "; ".join(differs))
    load_train_state(checkpoint, mapped=True)  # readable; its tensors are the workers' to read
    other = other_settings(meta, cfg)
    if other:
        log.info("resuming %s with other settings than its run's: %s", redact(checkpoint), "; ".join(other))
    changes = head_changes(meta.get("heads") or {}, model_heads(cfg))
    if changes.fresh:
        log.info("%s has no %s head: it starts from its initial weights", redact(checkpoint), ", ".join(changes.fresh))
    if changes.dropped:
        log.info(
            "%s: its %s head is not loaded: this run has no such task", redact(checkpoint), ", ".join(changes.dropped)
        )


def check_resume_data(cfg: RunConfig, digests: dict[str, str]) -> None:
    if cfg.trainer.resume_from:
        differs = data_mismatches(read_meta(cfg.trainer.resume_from), digests)
        if differs:
            raise ConfigError(f"cannot resume {redact(cfg.trainer.resume_from)}: " + "; ".join(differs))
