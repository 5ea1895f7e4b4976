"""Ray Tune sweeps (the library behind `convsts tune`): a trial is the run config plus a space's
sampled dotted keys; one MLflow parent run per sweep and one child run per trial; a sweep's --out
records what defines it (sweep.json), so a rerun resumes only the same sweep.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from omegaconf import OmegaConf

from convsts.datasets.evalsets import read_stsb, stsb_split_path
from convsts.io import storage
from convsts.io.errors import ConfigError
from convsts.io.nested import changed_values, flatten
from convsts.io.redaction import redact, redact_tree
from convsts.io.storage import is_uri, resolve_path
from convsts.models import load
from convsts.models.sts_transform import StsTransform, fit_sts_transform, load_sts_transform
from convsts.models.sts_transform import file_name as sts_file
from convsts.ray_jobs.config.schema import RunConfig, from_dict, merge_layer
from convsts.ray_jobs.evaluation.plots import fraction_curve_plot
from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer
from convsts.ray_jobs.evaluation.sts import stsb_embeddings, transformed_sts_metrics
from convsts.ray_jobs.pipelines.evaluate import evaluate
from convsts.ray_jobs.pipelines.inputs import ensure_prepared
from convsts.ray_jobs.runtime.output_lock import holds_output
from convsts.ray_jobs.runtime.process import ensure_ray, log, tracking_uri
from convsts.ray_jobs.runtime.resources import TRIAL_FUNCTION_CPU, alive_nodes, trials_at_once
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training.run import prepared_location, run_training
from convsts.tune_spaces import TuneSpace

SWEEP_MATRIX = "sweep"  # the sts_matrix sweep's matrix in the checkpoint: sts_transform_sweep.safetensors


STATE_FILE = "sweep.json"  # OUT/sweep.json: the parent run id and what defines the sweep (sweep_record), for resumption


def trial_config(base: dict[str, Any], params: dict[str, Any], fixed: Sequence[str] = ()) -> RunConfig:
    """base config dict + the space's fixed overrides + a trial's dotted keys -> a validated RunConfig."""
    merged = OmegaConf.create(base)
    if fixed:
        merged = merge_layer(merged, OmegaConf.from_dotlist(list(fixed)))
    if params:
        layer = OmegaConf.create()
        for key, value in params.items():
            OmegaConf.update(layer, key, value)
        merged = merge_layer(merged, layer)
    return from_dict(cast(dict[str, Any], OmegaConf.to_container(merged)), source="trial parameters")


def check_space_keys(space: TuneSpace, base: RunConfig, extra: dict[str, Any]) -> None:
    """Every dotted key of the space names a config field (a value, or a whole mapping such as
    trainer.task_weights): fail before any trial starts."""
    for key in list(space.params()) + list(extra):
        node: Any = base.to_dict()
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"tune space {space.name}: config key '{key}' does not exist")
            node = node[part]


def grid_overrides(items: Sequence[str]) -> dict[str, Any]:
    """--param key=[v1,v2] -> {key: tune.grid_search([v1, v2])}; key=v -> a fixed value."""
    from ray import tune  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--param {item!r}: expected key=value or key=[v1,v2]")
        value = OmegaConf.from_dotlist([f"v={raw}"])["v"]
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        out[key] = tune.grid_search(list(value)) if isinstance(value, list) else value
    return out


def _plain(params: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in params.items()}


def _trial_run(uri: str, experiment: str, parent_run_id: str, params: dict[str, Any]) -> str:
    """The trial's child run: reused when a restored sweep restarts the trial, else created."""
    from ray import tune  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it

    trial_id = tune.get_context().get_trial_id()
    run_id = tracking.find_run(uri, experiment, {"mlflow.parentRunId": parent_run_id, "convsts.trial_id": trial_id})
    if run_id is None:
        run_id = tracking.start_run(
            uri,
            experiment,
            f"{tune.get_context().get_trial_name()}",
            _plain(params),
            tags={"convsts.job": "tune-trial", "convsts.trial_id": trial_id},
            parent_run_id=parent_run_id,
        )
    # One point per start: a trial that a resumed sweep reruns shows two.
    tracking.log_metrics(uri, run_id, {"trial/started": time.time()})
    return run_id


def sts_matrix_trial(
    params: dict[str, Any],
    embeddings: dict[str, dict[str, np.ndarray]],
    base: dict[str, Any],
    fixed: list[str],
    uri: str,
    experiment: str,
    parent_run_id: str,
) -> None:
    import ray.tune  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it
    from ray.tune import Checkpoint  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it

    cfg = trial_config(base, params, fixed)
    run_id = _trial_run(uri, experiment, parent_run_id, params)

    def on_epoch(epoch: int, dev_r: float, best: float, new_best: np.ndarray | None) -> None:
        metrics = {"stsb_tuned/dev/pearson": best, "stsb_tuned/dev/pearson_epoch": dev_r, "epoch": epoch}
        tracking.log_metrics(uri, run_id, metrics, step=epoch)
        if new_best is None:
            ray.tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:  # the best matrix so far travels with the report
            StsTransform(new_best, cfg.eval.tuned, best, epoch).save(tmp)
            ray.tune.report(metrics, checkpoint=Checkpoint.from_directory(tmp))

    fitted = fit_sts_transform(embeddings["train"], embeddings["dev"], cfg.eval.tuned, on_epoch=on_epoch)
    tracking.log_metrics(
        uri,
        run_id,
        {"stsb_tuned/dev/pearson": fitted.dev_pearson, "stsb_tuned/best_epoch": fitted.best_epoch},
        step=cfg.eval.tuned.epochs,
    )
    tracking.end_run(uri, run_id)


def train_trial(
    params: dict[str, Any],
    base: dict[str, Any],
    fixed: list[str],
    uri: str,
    experiment: str,
    parent_run_id: str,
    prepared: str,
    trials_dir: str,
) -> None:
    """One multitask training (a TorchTrainer inside the trial, Train V2 style), then evaluation."""
    import ray.tune  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it
    from ray.tune.integration.ray_train import (
        TuneReportCallback,  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it
    )

    cfg = trial_config(base, params, fixed)
    run_id = _trial_run(uri, experiment, parent_run_id, params)
    trial_id = ray.tune.get_context().get_trial_id()
    # Under the sweep's output folder (Ray's own trial folder lives in its temporary session dir).
    trial_dir = Path(trials_dir) / trial_id
    # The trial's checkpoints: its own folder, keyed by its id, under trainer.storage_path (shared by
    # the sweep's nodes) or else the sweep's trials/ray_results. A retry (FailureConfig) or a
    # resumed sweep restarts the trial from its own last checkpoint there, never from another's.
    cfg.trainer.storage_path = cfg.trainer.storage_path or str(Path(trials_dir) / "ray_results")
    try:
        # fresh: the trial's earlier outputs in trial_dir/run (a restart's) are replaced.
        trained = run_training(
            cfg,
            trial_dir / "run",
            run_id=run_id,
            prepared_dir=prepared,
            extra_callbacks=[TuneReportCallback()],
            fresh=True,
            storage_key=trial_id,
        )
        results = evaluate(EmbeddingScorer(load(trained.checkpoint), cfg.eval.batch_size), cfg, prepared)
    except BaseException:
        tracking.end_run(uri, run_id, "FAILED")
        raise
    results.update({f"data/{name}_train_pairs": float(n) for name, n in trained.train_rows.items()})
    tracking.log_metrics(uri, run_id, results, step=cfg.trainer.steps)
    tracking.end_run(uri, run_id)
    ray.tune.report({**results, "checkpoint_dir": str(trained.checkpoint)})


def _concurrency(space: TuneSpace, cfg: RunConfig) -> tuple[dict[str, float], int]:
    """(resources of the trial function, trials at once), placed node by node (resources.py)."""
    nodes = alive_nodes()
    if space.objective == "sts_matrix":
        return {"cpu": 1.0}, max(1, int(sum(n.get("CPU", 0.0) for n in nodes)))
    return {"cpu": TRIAL_FUNCTION_CPU}, trials_at_once(cfg, nodes)


def stsb_embeddings_of(checkpoint: str, cfg: RunConfig) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """(STS-B frames, their embeddings) for train, dev and test."""

    scorer = EmbeddingScorer(load(checkpoint), cfg.eval.batch_size)
    stsb_dir = resolve_path(cfg.data.stsb_dir)
    frames = {split: read_stsb(stsb_split_path(stsb_dir, split)) for split in ("train", "dev", "test")}
    return frames, {split: stsb_embeddings(scorer, frame) for split, frame in frames.items()}


def expected_trials(param_space: dict[str, Any], num_samples: int) -> int:
    """num_samples x the size of every grid dimension: what Tune generates for this space."""
    total = num_samples
    for value in param_space.values():
        if isinstance(value, dict) and "grid_search" in value:
            total *= len(value["grid_search"])
    return total


def sweep_record(
    space: TuneSpace,
    cfg: RunConfig,
    param_overrides: dict[str, Any],
    num_samples: int,
    checkpoint: str | None,
    prepared_dir: str | None,
) -> dict[str, Any]:
    """What defines a sweep, as STATE_FILE records it (credentials redacted): the space, its --param
    dimensions, the number of samples, the checkpoint and prepared folder, the base run config
    (with the tracking store its trials log to). A resumed sweep's trials are built from this
    command's config but keep the recorded parameters, so a rerun that differs is refused."""

    def where(path: str | None) -> str:
        return "" if not path else path if is_uri(path) else str(Path(resolve_path(path)).resolve())

    return redact_tree(
        {
            "space": space.name,
            "param": param_overrides,
            "num_samples": num_samples,
            "checkpoint": where(checkpoint),
            "prepared": where(prepared_dir),
            "config": cfg.to_dict(),
        }
    )


def resume_differences(state: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """'KEY=RECORDED (this command: VALUE)' for each part of sweep_record that differs from the one
    in STATE_FILE (a state that records none differs whole)."""
    recorded = state.get("sweep")
    if not isinstance(recorded, dict):
        return [f"{STATE_FILE} records no sweep settings"]
    sections = {
        "--space": "space",
        "--num-samples": "num_samples",
        "--checkpoint": "checkpoint",
        "--prepared": "prepared",
    }
    out = [
        f"{flag} {recorded.get(key)!r} (this command: {record[key]!r})"
        for flag, key in sections.items()
        if recorded.get(key) != record[key]
    ]
    out += changed_values(
        flatten(recorded.get("param", {}), "--param "), flatten(record["param"], "--param "), "this command"
    )
    return out + changed_values(flatten(recorded.get("config", {})), flatten(record["config"]), "this command")


def _unfinished(result_grid, expected: int) -> int:
    """Trials not ended: started but neither terminated nor errored, or never created (Tune
    creates trials lazily, so an interrupted sweep's result grid lacks the ones not yet begun)."""
    ended = result_grid.num_terminated + result_grid.num_errors
    return max(expected, len(result_grid)) - ended


@holds_output("tune")  # one run at a time in out_dir, for the whole run
def run_sweep(
    space: TuneSpace,
    cfg: RunConfig,
    out_dir: str | Path,
    checkpoint: str | None = None,
    reddit_checkpoint: str | None = None,
    prepared_dir: str | None = None,
    param_overrides: dict[str, Any] | None = None,
    num_samples: int | None = None,
    fresh: bool = False,
    max_concurrent: int | None = None,
    max_failures: int = 2,
) -> dict[str, Any]:
    """The sweep of `space` over `cfg` into out_dir (resumed when out_dir holds the same sweep,
    unless `fresh`); returns the best trial's results (also out_dir/results.json). A trial that
    fails (a lost node, an error) is retried up to `max_failures` times from its own last
    checkpoint; one that still fails ends its MLflow run FAILED and, once the others' results are
    written, the sweep raises SweepTrialsFailed naming it."""
    from ray import tune  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it

    started, out_dir = time.time(), Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    param_overrides, num_samples = dict(param_overrides or {}), num_samples or space.num_samples
    check_sweep_inputs(space, cfg, param_overrides, checkpoint, reddit_checkpoint)
    uri = _sweep_store(cfg, out_dir)
    resources, concurrency = _concurrency(space, cfg)
    concurrency = min(concurrency, max_concurrent) if max_concurrent else concurrency

    resume = _resuming(out_dir / "ray_tune" / space.name, out_dir / STATE_FILE, fresh)
    param_space = {**space.params(), **param_overrides}
    record = sweep_record(space, cfg, param_overrides, num_samples, checkpoint, prepared_dir)
    expected, initial = expected_trials(param_space, num_samples), checkpoint or reddit_checkpoint
    parent_run_id, expected = open_sweep(space, cfg, out_dir, uri, record, resume, expected, initial)
    base = cfg.to_dict()
    trainable, frames, embeddings = sweep_trainable(space, cfg, out_dir, uri, parent_run_id, checkpoint, prepared_dir)
    trainable, counts = tune.with_resources(trainable, resources), (num_samples, concurrency, max_failures)
    tuner = _tuner(space, trainable, param_space, counts, out_dir, resume)
    log.info("sweep %s: %s trials at once, %s per trial function", space.name, concurrency, resources)
    grid = tuner.fit()
    _check_finished(grid, expected, out_dir / "ray_tune" / space.name)
    failed = _close_trial_runs(grid, uri, cfg.mlflow.experiment, parent_run_id, space.max_t)
    if len(failed) == len(grid):
        raise SweepTrialsFailed(f"every trial failed ({', '.join(failed)}); see {out_dir / 'ray_tune' / space.name}")
    best = grid.get_best_result(metric=space.metric, mode=space.mode, scope="last")
    results = sweep_results(grid, best, space, base, out_dir, (frames, embeddings, checkpoint))
    results.update(mlflow_run_id=parent_run_id, failed_trials=failed, seconds=round(time.time() - started, 1))
    storage.write_results(out_dir / "results.json", results)
    log_sweep(uri, cfg, parent_run_id, best, space, results, out_dir, failed)
    if failed:
        raise SweepTrialsFailed(
            f"{len(failed)} of {len(grid)} trials failed after {max_failures} retries ({', '.join(failed)}); their "
            f"MLflow runs are FAILED; {out_dir / 'results.json'} and the curve hold the other trials"
        )
    return results


def _resuming(experiment_path: Path, state_file: Path, fresh: bool) -> bool:
    """Whether this sweep resumes the one in experiment_path; with `fresh` that one is removed."""
    from ray import tune  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it

    if fresh:
        if experiment_path.exists():
            shutil.rmtree(experiment_path)
        return False
    return state_file.is_file() and tune.Tuner.can_restore(str(experiment_path))


def _sweep_store(cfg: RunConfig, out_dir: Path) -> str:
    """The sweep's tracking store, with its experiment created before trials race to create it; Ray started."""
    uri = tracking_uri(cfg.mlflow.tracking_uri, out_dir)
    ensure_ray()
    cfg.mlflow.tracking_uri = uri  # trials log child runs (and their training) into this same store
    tracking.experiment_id(uri, cfg.mlflow.experiment)
    return uri


def _check_finished(grid, expected: int, experiment_path: Path) -> None:
    pending = _unfinished(grid, expected)
    if pending:
        raise SweepInterrupted(
            f"{pending} trial(s) did not finish; rerun the same command to resume (state in {experiment_path})"
        )


def _tuner(space: TuneSpace, trainable, param_space: dict, counts: tuple[int, int, int], out_dir: Path, resume: bool):
    from ray import tune  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it

    if resume:
        return tune.Tuner.restore(
            str(out_dir / "ray_tune" / space.name), trainable=trainable, resume_unfinished=True, resume_errored=True
        )
    num_samples, concurrency, max_failures = counts
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            num_samples=num_samples, scheduler=_scheduler(space), max_concurrent_trials=concurrency
        ),
        run_config=tune.RunConfig(
            name=space.name,
            storage_path=str(out_dir / "ray_tune"),
            failure_config=tune.FailureConfig(max_failures=max_failures),
            verbose=1,
        ),
    )


def sweep_results(grid, best, space: TuneSpace, base: dict, out_dir: Path, sts_inputs) -> dict[str, Any]:
    """The best trial's results (and out_dir/best_config.yaml; the fitted matrix or the curve)."""
    best_params = dict(best.config.items())
    storage.write_text(out_dir / "best_config.yaml", redact(trial_config(base, best_params, space.fixed).to_yaml()))
    if space.objective == "sts_matrix":
        frames, embeddings, checkpoint = sts_inputs
        results = _sts_matrix_results(best, frames, embeddings, checkpoint, out_dir)
    else:
        results = {k: v for k, v in best.metrics.items() if isinstance(v, (int, float)) and "/" in k}
        results["checkpoint"] = best.metrics.get("checkpoint_dir", "")
        rows = _trials_table(grid, space, out_dir)
        if space.table and rows:
            _mean_table(rows, space, out_dir)
        if space.curve:  # the space's curve: its report metrics against one of its parameters
            _fraction_curve(grid, space, out_dir)
    results.update(
        best_trial=Path(best.path).name, trials=len(grid), trials_failed=sum(r.error is not None for r in grid)
    )
    return results


def check_sweep_inputs(
    space: TuneSpace,
    cfg: RunConfig,
    param_overrides: dict[str, Any],
    checkpoint: str | None,
    reddit_checkpoint: str | None,
) -> None:
    """Refuse a sweep that cannot run, before any work. A train sweep's trials warm-start from
    --reddit-checkpoint when it is given (else from trainer.warm_start, or from scratch)."""
    check_space_keys(space, cfg, param_overrides)
    if space.objective == "sts_matrix" and not checkpoint:
        raise ConfigError(f"space {space.name} needs --checkpoint (the encoder whose embeddings are tuned)")
    if space.objective == "train" and reddit_checkpoint:
        cfg.trainer.warm_start = str(Path(reddit_checkpoint).resolve())
    if space.objective == "train":
        log.info("sweep %s: every trial starts from %s", space.name, cfg.trainer.warm_start or "scratch (seeded)")


def open_sweep(
    space: TuneSpace,
    cfg: RunConfig,
    out_dir: Path,
    uri: str,
    record: dict[str, Any],
    resume: bool,
    expected: int,
    checkpoint: str | None,
) -> tuple[str, int]:
    """(the MLflow parent run, the number of trials): the recorded ones of the sweep resumed (refused
    when this command's sweep differs from it), else a new parent run and OUT/sweep.json."""
    state_file = out_dir / STATE_FILE
    if resume:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        differs = resume_differences(state, record)
        if differs:
            raise ConfigError(
                f"{out_dir} holds an interrupted or finished sweep that this command would resume, "
                f"but it differs: {'; '.join(differs)}; rerun it as it was, pass --fresh to start "
                f"over, or choose another --out"
            )
        log.info("resuming sweep %s (MLflow parent run %s) from %s", space.name, state["parent_run_id"], out_dir)
        return state["parent_run_id"], state["expected_trials"]
    parent_run_id = tracking.start_run(
        uri,
        cfg.mlflow.experiment,
        cfg.mlflow.run_name or f"tune-{space.name}",
        {
            **flatten(cfg.to_dict()),
            "tune.space": space.name,
            "tune.objective": space.objective,
            "tune.metric": space.metric,
            "tune.checkpoint": checkpoint or "",
            "tune.param_overrides": repr(record["param"]),
        },
        tags={"convsts.job": "tune", "convsts.space": space.name},
    )
    state = {"parent_run_id": parent_run_id, "space": space.name, "expected_trials": expected, "sweep": record}
    storage.write_text(state_file, json.dumps(state, indent=2))
    return parent_run_id, expected


def sweep_trainable(
    space: TuneSpace,
    cfg: RunConfig,
    out_dir: Path,
    uri: str,
    parent_run_id: str,
    checkpoint: str | None,
    prepared_dir: str | None,
):
    """(the trial function with its shared inputs bound, STS-B frames, embeddings): an sts_matrix
    sweep encodes STS-B once here; a train sweep prepares its data once here."""
    from ray import tune  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it

    shared = dict(
        base=cfg.to_dict(), fixed=space.fixed, uri=uri, experiment=cfg.mlflow.experiment, parent_run_id=parent_run_id
    )
    if space.objective == "sts_matrix":
        log.info("encoding STS-B train/dev/test once with %s", checkpoint)
        frames, embeddings = stsb_embeddings_of(str(checkpoint), cfg)  # check_sweep_inputs: it is given
        return tune.with_parameters(sts_matrix_trial, embeddings=embeddings, **shared), frames, embeddings
    prepared = prepared_location(cfg, out_dir, prepared_dir)
    ensure_prepared(cfg, prepared)
    trainable = tune.with_parameters(train_trial, prepared=str(prepared), trials_dir=str(out_dir / "trials"), **shared)
    return trainable, None, None


def _scheduler(space: TuneSpace):
    if space.scheduler != "asha":
        return None
    from ray.tune.schedulers import (
        ASHAScheduler,  # deferred: Ray takes seconds to import; Ray-free paths and `--help` skip it
    )

    return ASHAScheduler(
        time_attr="training_iteration",
        metric=space.metric,
        mode=space.mode,
        max_t=space.max_t,
        grace_period=max(1, min(5, space.max_t // 4)),
        reduction_factor=3,
    )


def log_sweep(
    uri: str, cfg: RunConfig, parent_run_id: str, best, space: TuneSpace, results: dict, out_dir: Path, failed=()
) -> None:
    """The parent run: the best trial's params, the results, a tag naming the best child run, the
    files of out_dir; then FINISHED, or FAILED (naming them) when trials failed."""
    best_child = tracking.find_run(
        uri,
        cfg.mlflow.experiment,
        {"mlflow.parentRunId": parent_run_id, "convsts.trial_id": best.metrics.get("trial_id", "")},
    )
    tracking.log_params(uri, parent_run_id, {f"best.{k}": v for k, v in _plain(dict(best.config.items())).items()})
    tracking.log_metrics(uri, parent_run_id, {k: v for k, v in results.items() if "/" in k})
    tracking.set_tags(uri, parent_run_id, {"convsts.best_trial_run": best_child or ""})
    for name in (
        "best_config.yaml",
        "results.json",
        "trials.csv",
        "table.md",
        "curve.png",
        "curve.csv",
        "sts_transform.safetensors",
    ):
        if (out_dir / name).is_file():
            tracking.log_artifact(uri, parent_run_id, str(out_dir / name))
    if (out_dir / "table.md").is_file():  # the run page opens on the space's table
        tracking.describe_run(uri, parent_run_id, f"{space.description}\n\n{(out_dir / 'table.md').read_text()}")
    if failed:
        tracking.set_tags(uri, parent_run_id, {"convsts.failed_trials": ",".join(failed)})
    tracking.end_run(uri, parent_run_id, "FAILED" if failed else "FINISHED")
    value = float(best.metrics.get(space.metric, math.nan))
    log.info(
        "sweep %s: %d trials in %.0f s; best %s = %.4f",
        space.name,
        results["trials"],
        results["seconds"],
        space.metric,
        value,
    )


class SweepInterrupted(RuntimeError):
    """Trials left unfinished (the sweep was stopped): the same command resumes it."""


class SweepTrialsFailed(RuntimeError):
    """Trials that failed after every retry; the others' results are written."""


def _close_trial_runs(grid, uri: str, experiment: str, parent_run_id: str, max_t: int = 0) -> list[str]:
    """Ends the trials' MLflow runs that are still RUNNING after the fit: FAILED for a trial that
    failed (its process lost with its node, or an error after every retry), FINISHED for one the
    scheduler stopped, tagged `convsts.stopped_early` unless it had reached `max_t` iterations (ASHA
    stops that one too, as its end: it ran whole). Returns the failed trials' ids."""
    trials = [(str(r.metrics.get("trial_id") or Path(r.path).name), r) for r in grid]
    failed = sorted(trial for trial, r in trials if r.error is not None)
    iterations = {trial: int(r.metrics.get("training_iteration") or 0) for trial, r in trials}
    for run in tracking.child_runs(uri, experiment, parent_run_id):
        trial = run.data.tags.get("convsts.trial_id", "")
        if trial in failed:
            tracking.set_tags(uri, run.info.run_id, {"convsts.failed": "true"})
            if run.info.status != "FAILED":
                tracking.end_run(uri, run.info.run_id, "FAILED")
        elif run.info.status == "RUNNING":
            early = not max_t or iterations.get(trial, 0) < max_t
            tracking.set_tags(uri, run.info.run_id, {"convsts.stopped_early": str(early).lower()})
            tracking.end_run(uri, run.info.run_id, "FINISHED")
    return failed


def _sts_matrix_results(best, frames, embeddings, checkpoint: str, out_dir: Path) -> dict[str, Any]:
    """Test is scored for the chosen trial only, with the matrix that its best dev epoch produced."""

    with best.checkpoint.as_directory() as folder:
        transform = load_sts_transform(folder)
    if transform is None:
        raise RuntimeError(f"the best trial's checkpoint {best.checkpoint.path} holds no STS matrix")
    results: dict[str, Any] = dict(transformed_sts_metrics(transform, frames, embeddings))
    transform.save(out_dir)
    # Beside the checkpoint under its own name (evaluate's matrix stays): encode(tuned=SWEEP_MATRIX).
    replaced = (Path(checkpoint) / sts_file(SWEEP_MATRIX)).is_file()
    saved = transform.save(checkpoint, SWEEP_MATRIX)
    log.info("%s %s (encode(tuned=%r) applies it)", "replaced" if replaced else "saved", saved, SWEEP_MATRIX)
    results["checkpoint"] = str(checkpoint)
    return results


def _trials_table(grid, space: TuneSpace, out_dir: Path) -> list[dict[str, Any]]:
    """out_dir/trials.csv: every finished trial of a train sweep, its searched values (one column per
    key of the space) and the space's report metrics, in trial order."""
    searched = sorted(space.params())
    rows = [
        {"trial": Path(r.path).name}
        | {key: _plain_value(r.config.get(key)) for key in searched}
        | {name: r.metrics.get(name, math.nan) for name in space.report}
        for r in sorted(grid, key=lambda r: Path(r.path).name)
        if r.error is None and r.metrics
    ]
    if rows:
        storage.write_text(out_dir / "trials.csv", _csv(rows))
    return rows


def _mean_table(rows: list[dict[str, Any]], space: TuneSpace, out_dir: Path) -> None:
    """out_dir/table.md: a column per value of space.table (in trial order), a row per report metric,
    each cell the mean and standard deviation over the trials that share the value (their seeds)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row[space.table], []).append(row)
    labels = [_label(value) for value in groups]
    lines = [f"| metric | {' | '.join(labels)} |", "|---" * (len(labels) + 1) + "|"]
    lines.append("| trials | " + " | ".join(str(len(members)) for members in groups.values()) + " |")
    for metric in space.report:
        lines.append(f"| {metric} | " + " | ".join(_mean_sd([r[metric] for r in rs]) for rs in groups.values()) + " |")
    storage.write_text(out_dir / "table.md", "\n".join(lines) + "\n")


def _label(value: Any) -> str:
    """A searched value as a column title: task weights {"reddit": 0.95, "snli": 0.05} -> reddit 0.95 + snli 0.05."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return str(value)
    if isinstance(parsed, dict):
        return " + ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in parsed.items())
    return str(parsed)


def _mean_sd(values: list[Any]) -> str:
    """'mean ± sd' of the finite values (sample sd), the value alone for one, '—' for none."""
    finite = np.array([v for v in values if isinstance(v, (int, float)) and math.isfinite(v)], dtype=np.float64)
    if len(finite) == 0:
        return "—"
    if len(finite) == 1:
        return f"{finite[0]:.4f}"
    return f"{finite.mean():.4f} ± {finite.std(ddof=1):.4f}"


def _plain_value(value: Any) -> Any:
    """A searched value as a CSV cell: a list or mapping (trainer.stages) as JSON."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _csv(rows: list[dict[str, Any]]) -> str:
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return table.getvalue()


def _fraction_curve(grid, space: TuneSpace, out_dir: Path) -> None:
    rows = []
    for result in grid:
        if result.error is not None or not result.metrics:
            continue
        row = {
            "fraction": result.config[space.curve],
            "seed": result.config.get("data.snli_fraction_seed", 0),
            "trial": Path(result.path).name,
        }
        row.update({name: result.metrics.get(name, math.nan) for name in space.report})
        rows.append(row)
    rows.sort(key=lambda r: (r["fraction"], r["seed"]))
    storage.write_text(out_dir / "curve.csv", _csv(rows))
    fraction_curve_plot(rows, [m for m in space.report if m.startswith("stsb/")], out_dir / "curve.png")
