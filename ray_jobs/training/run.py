"""The driver of a training job: prepared data, tokenizer, datasets, the TorchTrainer, the final
checkpoint and the MLflow run. `run_training` is what `convsts train`, `demo` and `tune` call."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from datasets import storage
from models.checkpoint import load_model
from ray_jobs import tracking
from ray_jobs.config import RunConfig, flatten, resolve_path
from ray_jobs.runtime import ensure_ray, log, tracking_uri
from ray_jobs.task_groups import plan_tasks
from ray_jobs.tasks import prepared_tasks
from ray_jobs.training.data import build_tokenizer, task_datasets, task_split_data_config


@dataclass
class TrainResult:
    checkpoint: Path
    run_id: str
    tracking_uri: str
    seconds: float
    mode: str
    train_rows: Dict[str, int]  # rows of each materialized task's training set (SNLI after data.snli_fraction)


def prepared_location(cfg: RunConfig, out_dir: str | Path, given: Optional[str | Path] = None) -> str:
    """Prepared shards: `given` (--prepared), else data.prepared_dir, else <out>/prepared; local or a URI."""
    location = str(given or resolve_path(cfg.data.prepared_dir) or Path(out_dir) / "prepared")
    return location if storage.is_uri(location) else str(Path(location).resolve())


def prepare_all(cfg: RunConfig, out_dir: str) -> Dict[str, Dict[str, Any]]:
    """Every task the run needs (prepared_tasks), each into out_dir/<task>; returns the manifests."""
    return {name: task.prepare(task.raw_inputs(cfg), task.prepared_dir(str(out_dir)), cfg)
            for name, task in prepared_tasks(cfg).items()}


def ensure_prepared(cfg: RunConfig, prepared: str) -> Dict[str, Dict[str, Any]]:
    """Prepare the shards of this run's tasks (prepared_tasks) that are not in `prepared` yet;
    returns the manifests written."""
    written = {}
    for name, task in prepared_tasks(cfg).items():
        if not storage.is_dir(task.train_path(prepared)):
            ensure_ray()
            written[name] = task.prepare(task.raw_inputs(cfg), task.prepared_dir(prepared), cfg)
    return written


def run_training(cfg: RunConfig, out_dir: str | Path, run_id: Optional[str] = None,
                 prepared_dir: Optional[str | Path] = None, extra_callbacks: Sequence[Any] = ()) -> TrainResult:
    """Build datasets and the TorchTrainer, fit, copy the final checkpoint to out_dir/checkpoint."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from ray_jobs.training.worker import train_loop_per_worker

    started = time.time()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    prepared = prepared_location(cfg, out_dir, prepared_dir)
    if cfg.trainer.eval_every:
        from ray_jobs.evaluation.sts import read_stsb_split

        read_stsb_split(cfg, "dev")  # fail here, naming the folder, rather than inside a worker
    ensure_ray()
    uri = tracking_uri(cfg.mlflow.tracking_uri, out_dir)
    params = flatten(cfg.to_dict())
    own_run = run_id is None  # a run we start we also end; a caller's run (demo, tune) is theirs to end
    if own_run:
        run_id = tracking.start_run(uri, cfg.mlflow.experiment, cfg.mlflow.run_name or cfg.name, params,
                                    tags={"convsts.job": "train"})
    else:
        tracking.log_params(uri, run_id, params)

    init = cfg.trainer.resume_from or cfg.trainer.warm_start
    if init:
        _, tokenizer, _ = load_model(init)
        log.info("tokenizer and initial weights from %s", init)
    else:
        tokenizer = build_tokenizer(cfg, prepared)
    log.info("tokenizer: %s, %d ids", type(tokenizer).__name__, tokenizer.num_words)
    datasets = task_datasets(cfg, prepared, tokenizer)
    train_rows = {}
    for name, task in prepared_tasks(cfg).items():
        if name in datasets and task.materialize:  # materialized: counting is free
            train_rows[name] = datasets[name].count()
    if train_rows:  # the SNLI-fraction sweep plots against data/snli_train_pairs
        tracking.log_metrics(uri, run_id, {f"data/{name}_train_pairs": n for name, n in train_rows.items()})
    plan = plan_tasks(cfg.trainer.task_weights, cfg.trainer.num_workers)
    log.info("%s", plan.describe())
    loop_config = {
        "run": cfg.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "datasets": sorted(datasets),
        "tracking_uri": uri,
        "run_id": run_id,
    }
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.trainer.num_workers,
            use_gpu=cfg.trainer.use_gpu,
            resources_per_worker={"CPU": cfg.trainer.cpus_per_worker},
        ),
        datasets=datasets,
        dataset_config=task_split_data_config(plan),
        run_config=ray.train.RunConfig(
            name=cfg.name,
            storage_path=cfg.trainer.storage_path or str(out_dir / "ray_results"),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.trainer.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.trainer.max_failures),
            callbacks=list(extra_callbacks) or None,
        ),
    )
    try:
        result = trainer.fit()
    except Exception:
        tracking.end_run(uri, run_id, "FAILED")
        raise
    if result.checkpoint is None:
        tracking.end_run(uri, run_id, "FAILED")
        raise RuntimeError(f"training finished without a checkpoint; see {out_dir / 'ray_results'}")
    final = out_dir / "checkpoint"
    if final.exists():
        shutil.rmtree(final)
    result.checkpoint.to_directory(str(final))
    seconds = time.time() - started
    tracking.log_metrics(uri, run_id, {"train/seconds": seconds}, cfg.trainer.steps)
    tracking.log_artifacts(uri, run_id, str(final), "checkpoint")
    (out_dir / "train.json").write_text(json.dumps(
        {"checkpoint": str(final), "mlflow_run_id": run_id, "tracking_uri": uri, "seconds": round(seconds, 1),
         "task_split_mode": plan.mode}, indent=2), encoding="utf-8")
    if own_run:
        tracking.end_run(uri, run_id)
    return TrainResult(final, run_id, uri, seconds, plan.mode, train_rows)
