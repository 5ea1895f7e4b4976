"""An --out folder's earlier training run, as the next run into that folder finds it.

A run records the MLflow run it logs to in OUT/mlflow_run.json as soon as that run exists. A run
whose process was killed leaves it RUNNING in MLflow; the next run into OUT (which holds OUT's lock,
so no live process runs there) ends it KILLED, tags it with why, and a run that resumes it is tagged
with the run it continues (`convsts.continues`). The checkpoint a refused run is told to resume is
one that exists: OUT/checkpoint after a finished run, else the newest Ray Train wrote under
OUT/ray_results/<name> before the kill.
"""

from __future__ import annotations

import json
from pathlib import Path

from convsts.datasets import storage
from convsts.models.checkpoint import TRAIN_STATE_FILE
from convsts.ray_jobs import tracking
from convsts.ray_jobs.runtime import log

RUN_RECORD = "mlflow_run.json"
CONTINUES_TAG = "convsts.continues"
ENDED_BY_TAG = "convsts.ended_by"


def record_run(out_dir: Path, run_id: str) -> None:
    """OUT/mlflow_run.json: the MLflow run this OUT's training logs to (its id only: no URI, which may
    carry credentials)."""
    storage.write_text(out_dir / RUN_RECORD, json.dumps({"run_id": run_id}) + "\n")


def recorded_run(out_dir: Path) -> str | None:
    """The MLflow run id an earlier run into OUT recorded, or None (none, or a file not ours)."""
    path = out_dir / RUN_RECORD
    if not path.is_file():
        return None
    try:
        run_id = json.loads(path.read_text(encoding="utf-8"))["run_id"]
    except (ValueError, KeyError, TypeError):
        log.warning("%s: not a run record (no run_id); left as it is", path)
        return None
    return run_id if isinstance(run_id, str) and run_id else None


def close_abandoned_run(out_dir: Path, tracking_uri: str) -> str | None:
    """The earlier run's MLflow run id (recorded_run); where it is still RUNNING, its process ended
    without closing it (killed: this process holds OUT's lock), so it ends KILLED, saying why."""
    run_id = recorded_run(out_dir)
    if run_id is None:
        return None
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


def resumable_checkpoint(out_dir: Path, name: str) -> Path | None:
    """The checkpoint of OUT's earlier run that --resume can take: OUT/checkpoint (a finished run's
    final one), else the newest one Ray Train kept under OUT/ray_results/<name> (a killed run's), or None."""
    if (out_dir / "checkpoint" / TRAIN_STATE_FILE).is_file():
        return out_dir / "checkpoint"
    kept = sorted((out_dir / "ray_results" / name).glob(f"checkpoint_*/{TRAIN_STATE_FILE}"))  # names sort by time
    return kept[-1].parent if kept else None


def resume_advice(out_dir: Path, name: str) -> str:
    """The part of a refusal that says how to continue OUT's earlier run, naming a path that exists."""
    checkpoint = resumable_checkpoint(out_dir, name)
    if checkpoint is None:
        return "it left no checkpoint to resume:"
    return f"pass --resume {checkpoint} to continue it,"
