"""An --out folder's training run, as the next run into that folder finds it, whatever ended it.

Before its first step a run records in OUT/run.json (written whole, atomically) its MLflow run and
where its checkpoints go: OUT/ray_results/<name>, or its own folder <storage_path>/<name>/<key>
under an explicit trainer.storage_path (a bucket). A driver that dies (killed, Ctrl+C, an OOM)
leaves that record, its checkpoints in the bucket, and its MLflow run RUNNING. The next run into
OUT (which holds OUT's lock, so no live process runs there) ends that MLflow run KILLED, saying why;
a plain rerun is refused naming the newest complete checkpoint; `--resume latest` continues from
it, tagged with the run it continues (`convsts.continues`). A checkpoint is complete when its
manifest, written last, and every file it lists are there (models.checkpoint.incomplete_reason):
the newest folder of a run killed during an upload is skipped, not resumed.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

from convsts.io import storage
from convsts.io.errors import ConfigError
from convsts.io.redaction import REDACTED, redact
from convsts.models.checkpoint import incomplete_reason
from convsts.ray_jobs.config.schema import RESUME_LATEST, RunConfig
from convsts.ray_jobs.runtime.process import log
from convsts.ray_jobs.tracking import runs as tracking

RUN_RECORD = "run.json"
CONTINUES_TAG = "convsts.continues"
ENDED_BY_TAG = "convsts.ended_by"
FINAL_CHECKPOINT = "checkpoint"  # OUT/checkpoint: a finished run's last checkpoint
# Ray Train's checkpoint folders, named by the time they were reported (not its checkpoint_manager_snapshot.json)
CHECKPOINT_NAME = re.compile(r"checkpoint_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d+")


def run_storage(cfg: RunConfig, out_dir: Path, key: str | None = None) -> tuple[str, str]:
    """(Ray Train's storage_path, the run's folder name there): where this run's checkpoints go.

    Every run owns its location. By default that is OUT/ray_results/<name> (<name>-<key> for a run
    that resumes another), and OUT holds one run (claim_output). An explicit trainer.storage_path (a bucket every node reaches) is shared by
    runs and sweeps, so the run's folder is <storage_path>/<name>/<key>: `key` a trial's own id
    (a sweep's rerun or retry finds that trial's checkpoints, and only those), else new for each run
    (a second run with the same name never restores the first's checkpoints). Ray Train's restarts
    within the run (node loss, trainer.max_failures) stay in it; OUT/run.json, train.json and the
    MLflow tag `convsts.storage` record it."""
    if not cfg.trainer.storage_path:
        if cfg.trainer.resume_from and key is None:
            key = new_run_key()  # a folder of its own: Ray Train would restore the resumed run's own checkpoint
        return str(out_dir / "ray_results"), cfg.name if key is None else f"{cfg.name}-{key}"
    return storage.join(cfg.trainer.storage_path, cfg.name), key or new_run_key()


def new_run_key() -> str:
    """A run's own folder name under a shared storage path: UTC start time and 6 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def record_run(out_dir: Path, run_id: str, cfg: RunConfig, location: tuple[str, str]) -> None:
    """OUT/run.json, before the first step: the MLflow run this OUT's training logs to and its
    checkpoint folder. Nothing that may carry credentials: the folder is stored redacted, for people,
    and as its key under trainer.storage_path, which the next run's own config completes."""
    record = {
        "run_id": run_id,
        "storage": redact(storage.join(*location)),
        "storage_key": location[1] if cfg.trainer.storage_path else None,
    }
    storage.write_text(out_dir / RUN_RECORD, json.dumps(record, indent=1) + "\n")


def _record(out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / RUN_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and isinstance(record.get("run_id"), str) and record["run_id"]:
            return record
    except ValueError:
        pass
    log.warning("%s: not a run record (no run_id); left as it is", path)
    return None


def recorded_run(out_dir: Path) -> str | None:
    """The MLflow run id an earlier run into OUT recorded, or None (none, or a file not ours)."""
    record = _record(out_dir)
    return record["run_id"] if record else None


def recorded_storage(out_dir: Path, cfg: RunConfig) -> str | None:
    """The checkpoint folder of the run OUT records (local or a URI), or None. Under an explicit
    trainer.storage_path it is rebuilt from this run's storage path (with whatever credentials that
    carries) and the recorded key; a record made under another storage path names its own (redacted)."""
    record = _record(out_dir)
    if record is None:
        return None
    key = record.get("storage_key")
    if isinstance(key, str) and key and cfg.trainer.storage_path:
        here = storage.join(*run_storage(cfg, out_dir, key))
        if redact(here) == record.get("storage"):
            return here
    where = record.get("storage")  # usable as it is unless credentials were taken out of it
    return where if isinstance(where, str) and where and REDACTED not in where else None


def close_abandoned_run(out_dir: Path, tracking_uri: str, going_on: str | None = None) -> str | None:
    """The earlier run's MLflow run id (recorded_run); where it is still RUNNING, its process ended
    without closing it (killed: this process holds OUT's lock), so it ends KILLED, saying why, unless
    it is `going_on` (a sweep's trial run again logs to its own run)."""
    run_id = recorded_run(out_dir)
    if run_id is None or run_id == going_on:
        return run_id
    status = tracking.run_status(tracking_uri, run_id)
    if status == "RUNNING":
        tracking.set_tags(
            tracking_uri,
            run_id,
            {ENDED_BY_TAG: f"its process ended with the run open; found by the next run into {out_dir}"},
        )
        tracking.end_run(tracking_uri, run_id, "KILLED")
        log.info(
            "MLflow run %s of the earlier run into %s was left RUNNING (its process was killed): now KILLED",
            run_id,
            out_dir,
        )
    return run_id


def newest_complete(folder: str) -> str | None:
    """The newest complete checkpoint among Ray Train's checkpoint_* folders in `folder` (local or a
    URI), or None; incomplete ones (an upload that stopped midway) are skipped, and logged."""
    try:
        names = [n for n in storage.entry_names(folder) if CHECKPOINT_NAME.fullmatch(n)]
    except FileNotFoundError:
        return None
    for name in sorted(names, reverse=True):  # the names sort by time
        candidate = storage.join(folder, name)
        reason = incomplete_reason(candidate)
        if reason is None:
            return candidate
        log.warning("%s: skipped, not a complete checkpoint (%s)", redact(candidate), reason)
    return None


def resumable_checkpoint(out_dir: Path, cfg: RunConfig) -> str | None:
    """The checkpoint of OUT's earlier run that --resume can take: OUT/checkpoint (a finished run's
    final one), else the newest complete one in the run's recorded checkpoint folder (a killed
    run's, local or in a bucket), or None."""
    final = out_dir / FINAL_CHECKPOINT
    if final.is_dir() and incomplete_reason(final) is None:
        return str(final)
    folder = recorded_storage(out_dir, cfg)
    return newest_complete(folder) if folder else None


def resolve_latest(out_dir: Path, cfg: RunConfig, storage_key: str | None = None) -> None:
    """trainer.resume_from=latest (`--resume latest`, or `--resume` alone) -> the checkpoint that
    resumable_checkpoint finds; refused in one line where OUT's run left none. A run with a key of
    its own (a sweep's trial, run again after its driver died) continues from the newest complete
    checkpoint in its own folder, if any: Ray Train registers a checkpoint a while after its files
    are written, so its snapshot may name none yet."""
    if storage_key and not cfg.trainer.resume_from:
        cfg.trainer.resume_from = newest_complete(storage.join(*run_storage(cfg, out_dir, storage_key))) or ""
        if cfg.trainer.resume_from:
            log.info("continuing from %s, the newest complete checkpoint of this run", redact(cfg.trainer.resume_from))
    if cfg.trainer.resume_from != RESUME_LATEST:
        return
    found = resumable_checkpoint(out_dir, cfg)
    if found is None:
        where = recorded_storage(out_dir, cfg)
        raise ConfigError(
            f"--resume {RESUME_LATEST}: {out_dir} records no run with a complete checkpoint"
            + (f" (looked in {redact(where)})" if where else "")
            + "; pass --resume CHECKPOINT, or train without --resume"
        )
    log.info("--resume %s: %s", RESUME_LATEST, redact(found))
    cfg.trainer.resume_from = found


def resume_advice(out_dir: Path, cfg: RunConfig) -> str:
    """The part of a refusal that says how to continue OUT's earlier run, naming a checkpoint that is complete."""
    checkpoint = resumable_checkpoint(out_dir, cfg)
    if checkpoint is None:
        return "it left no complete checkpoint to resume:"
    return f"its newest complete checkpoint is {redact(checkpoint)}; pass --resume {RESUME_LATEST} to continue it,"


def interrupted_run(out_dir: Path, cfg: RunConfig) -> str | None:
    """The recorded checkpoint folder of OUT's run when it holds a checkpoint and the run did not
    finish (no train.json): a driver that died. None otherwise."""
    if (out_dir / "train.json").exists():
        return None
    folder = recorded_storage(out_dir, cfg)
    if folder is None:
        return None
    try:
        names = storage.entry_names(folder)
    except FileNotFoundError:
        return None
    return folder if any(CHECKPOINT_NAME.fullmatch(n) for n in names) else None
