"""The driver of a training job: the run's start (checks, the decision, the actions), the
tokenizer and datasets, the fit, the final checkpoint and model, and the MLflow run.
`run_training` is what `convsts train`, `demo` and `tune` call."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from convsts.io import storage
from convsts.io.dotted import flatten
from convsts.io.folders import replaced_whole
from convsts.io.redaction import redact
from convsts.models.checkpoint import Checkpoint, hashed_here, read_model_files, save_model_folder
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.evaluation.sts import read_stsb_split
from convsts.ray_jobs.runtime.dead_train_runs import release_dead_fits
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.output_lock import holds_output
from convsts.ray_jobs.runtime.ray_start import ensure_ray
from convsts.ray_jobs.runtime.resources import alive_nodes, check_training_fits
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.runtime.tracking_store import tracking_uri
from convsts.ray_jobs.tasks import prepared_tasks, trained_tasks
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.tracking.mlflow_model import log_model
from convsts.ray_jobs.tracking.model_card import run_facts, write_card
from convsts.ray_jobs.training.data_feed import check_prepared, task_listings, task_shards
from convsts.ray_jobs.training.lineage import (
    CONTINUES_TAG,
    SUPERSEDED_TAG,
    Link,
    RunStart,
    apply_start,
    decide_start,
    join_chain,
    mark_link,
    mark_superseded,
    new_link,
)
from convsts.ray_jobs.training.loop import SCORE_METRIC
from convsts.ray_jobs.training.ray_trainer import fit
from convsts.ray_jobs.training.reporting import log_loss_curves, log_prepared_datasets
from convsts.ray_jobs.training.start_checks import (
    check_initial_weights,
    check_resume_data,
    data_digests,
    history_until,
    prepared_location,
)
from convsts.ray_jobs.training.task_groups import plan_for
from convsts.ray_jobs.training.tokenizer_fit import build_tokenizer


@dataclass
class TrainResult:
    checkpoint: Path
    run_id: str
    tracking_uri: str
    seconds: float
    mode: str
    train_rows: dict[str, int]  # rows of each filtered task's training set (SNLI after data.snli_fraction)
    model: Path  # OUT/model: the encoder without optimizer state, with its model card


def _check_cluster(cfg: RunConfig, chain: Sequence[Link]) -> None:
    """Ray started or joined; the cluster reservations of the chain's earlier fits released (their
    drivers are gone: this run holds OUT; a killed one's would hold the cluster for minutes); a
    layout that fits no node refused, not left waiting."""
    ensure_ray()
    release_dead_fits(k.ray_train_run for k in chain)
    fit_now = check_training_fits(cfg, alive_nodes())
    if cfg.trainer.elastic:
        log.info("elastic worker group %s: %d fit on the cluster now", list(cfg.trainer.worker_range), fit_now)


@holds_output("train")  # one run at a time in out_dir, for the whole run
def run_training(
    cfg: RunConfig,
    out_dir: str | Path,
    run_id: str | None = None,
    prepared_dir: str | Path | None = None,
    extra_callbacks: Sequence[Any] = (),
    fresh: bool = False,
    mlflow_uri: str | None = None,
    storage_key: str | None = None,
    prepare_missing: Callable[[RunConfig, str], Any] | None = None,
) -> TrainResult:
    """A run's start is checks -> decision -> actions: every refusal comes before anything in OUT
    or in MLflow is removed, written or changed (docs/reliability.md). Then the datasets and the
    TorchTrainer, fit, OUT/checkpoint and OUT/model. The MLflow run ends FAILED on any error.
    `mlflow_uri`: the tracking URI as the caller resolved (and checked) it; None resolves it here.
    `storage_key`: this run's own folder under an explicit trainer.storage_path (run_storage).
    `prepare_missing(cfg, prepared)`: prepares the tasks' data that `prepared` lacks (the run's
    input, which --fresh keeps; pipelines.inputs.ensure_prepared), called once every check that
    needs no data has passed."""
    out_dir = Path(out_dir).resolve()
    # Checks that read only
    storage.check_bucket(cfg.trainer.storage_path, "trainer.storage_path")
    prepared = prepared_location(cfg, out_dir, prepared_dir)
    if cfg.trainer.eval_every:
        read_stsb_split(cfg, "dev")  # fail here, naming the folder, rather than inside a worker
    uri = mlflow_uri or tracking_uri(cfg.mlflow.tracking_uri, out_dir)  # a server that is not there, before any work
    # The decision: fresh, continuing which checkpoint, or refused
    start = decide_start(out_dir, cfg, fresh, storage_key)
    cfg = start.config(cfg)
    check_initial_weights(cfg)
    tasks = prepared_tasks(cfg)
    # Before Ray starts and before any prepare writes: the folders there, and a resume's data in them
    # against the data its checkpoint was trained on.
    manifests = check_prepared(prepared, tasks, cfg, present_only=True)
    check_resume_data(cfg, data_digests(manifests))
    _check_cluster(cfg, start.chain)
    manifests, digests = _all_prepared(cfg, prepared, tasks, manifests, prepare_missing)
    # The actions
    apply_start(out_dir, start, uri, run_id, redact(cfg.to_yaml()))
    own_run = run_id is None  # a run we start we also end; a caller's run (demo, tune) is theirs to end
    mlflow_run = _open_run(cfg, out_dir, uri, run_id, start)
    log.info("checkpoints: %s", redact(start.storage.uri))
    try:
        log_prepared_datasets(cfg, prepared, manifests, digests, uri, mlflow_run.run_id)
        tracking.set_tags(uri, mlflow_run.run_id, {"convsts.storage": redact(start.storage.uri)})
        data = PreparedData(manifests, digests)
        result = _train(cfg, out_dir, prepared, mlflow_run, data, extra_callbacks, start)
    except BaseException as err:
        status = tracking.ended_status(err)  # never left RUNNING (a caller's run ends with it)
        try:
            tracking.end_run(uri, mlflow_run.run_id, status)
        except Exception as closing:  # a full disk fails the store's write too: the run's own error comes first
            log.warning("could not mark MLflow run %s %s (%s) after: %s", mlflow_run.run_id, status, closing, err)
        raise
    if own_run:
        tracking.end_run(uri, mlflow_run.run_id)
    return result


def _all_prepared(
    cfg: RunConfig, prepared: str, tasks: dict, checked: dict, prepare_missing: Callable[[RunConfig, str], Any] | None
) -> tuple[dict, dict]:
    """(every task's manifest, their digests): the tasks not `checked` yet prepared where missing
    and checked; a resume's data checked against its checkpoint's (the `checked` tasks' was before)."""
    if prepare_missing is not None:
        prepare_missing(cfg, prepared)
    rest = {name: task for name, task in tasks.items() if name not in checked}
    manifests = checked | check_prepared(prepared, rest, cfg)  # complete prepared folders
    digests = data_digests(manifests)
    check_resume_data(cfg, digests)
    return manifests, digests


def _open_run(cfg: RunConfig, out_dir: Path, uri: str, run_id: str | None, start: RunStart) -> TrackedRun:
    """The MLflow run this run logs to (a new one, or the caller's), with the run it continues
    (where this store has it: of another store's, every step is this run's to log), joined to OUT's
    chain before the first step."""
    params = flatten(cfg.to_dict())
    continues = start.continues if start.continues and tracking.run_status(uri, start.continues) else None
    if run_id is None:
        tags = {"convsts.job": "train"} | ({CONTINUES_TAG: continues} if continues else {})  # as MLflow shows it
        run_id = tracking.start_run(uri, cfg.mlflow.experiment, cfg.mlflow.run_name or cfg.name, params, tags=tags)
    elif continues != run_id:  # a trial run again keeps the params of its first start (MLflow's are write-once)
        tracking.log_params(uri, run_id, params)
    join_chain(out_dir, start, new_link(out_dir, run_id, cfg, start.storage))  # before the first step
    return TrackedRun(uri, run_id, continues)


class TrackedRun(NamedTuple):
    """The MLflow run a fit logs to: its store, its id, and the run its checkpoint came from (None
    when it starts fresh or that run is in another store)."""

    uri: str
    run_id: str
    continues: str | None


class PreparedData(NamedTuple):
    """What the run trains on: each task's prepared manifest and its data digest."""

    manifests: dict[str, dict[str, Any]]
    digests: dict[str, str]


def _train(
    cfg: RunConfig,
    out_dir: Path,
    prepared: str,
    mlflow_run: TrackedRun,
    data: PreparedData,
    extra_callbacks: Sequence[Any],
    start: RunStart,
) -> TrainResult:
    started, location = time.time(), start.storage
    uri, run_id, manifests, digests = mlflow_run.uri, mlflow_run.run_id, data.manifests, data.digests
    for task in trained_tasks(cfg).values():
        task.check_feed(cfg, prepared)
    tokenizer = _tokenizer(cfg, prepared)
    listings = task_listings(cfg, prepared, manifests)
    filtered = {n: t for n, t in trained_tasks(cfg).items() if t.filter_columns}
    train_rows = {n: task_shards(t, cfg, listings[n]).rows for n, t in filtered.items()}
    if train_rows:  # the SNLI-fraction sweep plots against data/snli_train_pairs
        tracking.log_metrics(uri, run_id, {f"data/{name}_train_pairs": n for name, n in train_rows.items()})
    plan = _task_split(cfg)
    until = _history_until(cfg, uri, run_id, start)  # the chain's runs past it tagged superseded
    loop_config = _loop_config(cfg, tokenizer, listings, mlflow_run, start, digests, until)
    result = fit(  # the fit's Ray Train id recorded in run.json as soon as the trainer is made
        cfg,
        location,
        loop_config,
        extra_callbacks,
        plan,
        lambda fit_id: mark_link(out_dir, run_id, ray_train_run=fit_id),
    )
    final, best = _keep_checkpoints(cfg, result, out_dir)
    last_state = Checkpoint.at(final).train_state(mapped=True) if cfg.trainer.elastic else None
    mode = last_state.mode if last_state is not None else plan.mode  # the last group's
    seconds = time.time() - started
    tracking.log_metrics(uri, run_id, {"train/seconds": seconds}, cfg.trainer.steps)
    log_loss_curves(cfg, uri, run_id, out_dir)
    # What users take away: the encoder without optimizer state, with its model card, as the run's
    # MLflow model (the full checkpoint stays in OUT/checkpoint for --resume).
    model_dir = save_model_folder(final, RunFolder(out_dir).model)
    write_card(model_dir, run_facts(cfg.to_dict(), manifests, digests, run_id, uri, seconds))
    model_uri = log_model(uri, run_id, model_dir, cfg.mlflow.register_as, step=cfg.trainer.steps)
    registered = f", registered as {cfg.mlflow.register_as}" if cfg.mlflow.register_as else ""
    log.info("model: %s (MLflow %s%s)", model_dir, model_uri, registered)
    train_json = {
        "checkpoint": str(final),
        "best_checkpoint": str(best) if best else None,
        "model": str(model_dir),
        "mlflow_model": model_uri,
        "mlflow_run_id": run_id,
        "tracking_uri": redact(uri),
        "seconds": round(seconds, 1),
        "task_split_mode": mode,
        "storage": redact(location.uri),
    }
    storage.write_text(RunFolder(out_dir).train_summary, json.dumps(train_json, indent=2))
    return TrainResult(final, run_id, uri, seconds, mode, train_rows, model_dir)


def _loop_config(
    cfg: RunConfig,
    tokenizer,
    listings: dict[str, Any],
    mlflow_run: TrackedRun,
    start: RunStart,
    digests: dict,
    until: int | None,
) -> dict[str, Any]:
    """What every worker's loop is a function of (worker.train_loop_per_worker)."""
    uri, run_id = mlflow_run.uri, mlflow_run.run_id
    return {
        "run": cfg.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "listings": listings,  # each trained task's shards (data_feed.task_listings)
        "tracking_uri": uri,
        "run_id": run_id,
        # Every step a run of OUT's chain logged is not logged again (a fallback to an older checkpoint
        # too), up to the checkpoint's step where this run takes a new trajectory from it.
        "continues": mlflow_run.continues,
        "chain_logged": tracking.chain_logged(uri, run_id, [mlflow_run.continues, *start.chain_run_ids], until),
        "provenance": {"data": digests, "run_id": run_id},  # a checkpoint names the run that wrote it
        # The checkpoints the checks hashed: a worker on this machine does not hash them again.
        "hashed": [hashed_here(p) for p in dict.fromkeys([cfg.trainer.resume_from, cfg.trainer.warm_start]) if p],
    }


def _task_split(cfg: RunConfig):
    """The task split at trainer.num_workers (an elastic group's MAX), said in one line; an elastic
    group's at MIN beside it (each group Ray starts is planned anew by its
    workers)."""
    plan = plan_for(cfg.trainer, cfg.trainer.max_workers)
    if cfg.trainer.elastic:
        low = plan_for(cfg.trainer, cfg.trainer.min_workers)
        log.info("at %d workers: %s; at %d: %s", low.world_size, low.describe(), plan.world_size, plan.describe())
    else:
        log.info("%s", plan.describe())
    return plan


def _tokenizer(cfg: RunConfig, prepared: str):
    """The checkpoint's tokenizer when the run resumes or warm-starts (its files read, not its
    weights: those are the workers' to load), else one built from the data."""
    init = cfg.trainer.resume_from or cfg.trainer.warm_start
    if init:
        tokenizer = read_model_files(init).tokenizer
        log.info("tokenizer and initial weights from %s", init)
    else:
        tokenizer = build_tokenizer(cfg, prepared)
    log.info("tokenizer: %s, %d ids", type(tokenizer).__name__, tokenizer.num_words)
    return tokenizer


class KeptCheckpoints(NamedTuple):
    """OUT's copies of a fit's checkpoints: the last one, and the best by STS-B dev (None without
    in-training evaluation)."""

    final: Path
    best: Path | None


def _history_until(cfg: RunConfig, uri: str, run_id: str, start: RunStart) -> int | None:
    """Where a resume with a new trajectory leaves its chain's history (start_checks.history_until),
    the chain's runs that logged past it tagged superseded, in one line; None otherwise."""
    until = history_until(cfg)
    if until is not None:
        superseded = mark_superseded(uri, run_id, start, until)
        if superseded:
            log.info(
                "other settings from step %d on: the steps after it that run(s) %s logged are superseded (tagged "
                "%s); this run logs its own",
                until,
                ", ".join(superseded),
                SUPERSEDED_TAG,
            )
    return until


def _keep_checkpoints(cfg: RunConfig, result, out_dir: Path) -> KeptCheckpoints:
    """The fit's last checkpoint as OUT/checkpoint and, with in-training evaluation, the best one by
    STS-B dev beside it."""
    if result.checkpoint is None:
        raise RuntimeError(f"training finished without a checkpoint; see {RunFolder(out_dir).ray_results}")
    final = _copy_whole(result.checkpoint, RunFolder(out_dir).final_checkpoint)
    best = None
    if cfg.trainer.eval_every:  # the checkpoint with the best in-training STS-B dev, beside the last
        chosen = result.get_best_checkpoint(SCORE_METRIC, "max")
        if chosen is not None:
            best = _copy_whole(chosen, RunFolder(out_dir).best_checkpoint)
            log.info("best checkpoint by %s: %s", SCORE_METRIC, best)
    return KeptCheckpoints(final, best)


def _copy_whole(checkpoint, target: Path) -> Path:
    """A Ray checkpoint copied whole to `target` (replaced_whole: a copy that fails, as on a full disk, leaves
    no half checkpoint there)."""
    with replaced_whole(target) as partial:
        checkpoint.to_directory(str(partial))
    return target
