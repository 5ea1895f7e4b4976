"""A sweep's trials: the run config of a trial (the base config, a space's fixed overrides and the
trial's dotted keys) and the two trial functions, each logging a child run of the sweep's parent run."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from omegaconf import OmegaConf
from ray import tune
from ray.tune import Checkpoint
from ray.tune.integration.ray_train import TuneReportCallback

from convsts.io.errors import ConfigError
from convsts.models.sentence_encoder import load
from convsts.models.sts_transform import StsTransform, fit_sts_transform, load_sts_transform
from convsts.ray_jobs.config.loader import from_dict, merge_layer
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer
from convsts.ray_jobs.evaluation.sts import read_stsb_split, stsb_embeddings
from convsts.ray_jobs.pipelines.evaluate import evaluate
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training.driver import run_training
from convsts.tune_spaces import TuneSpace

STARTED_METRIC = "trial/started"  # a trial's starts: the time of each, at steps 0, 1, ...


@dataclass(frozen=True)
class ParentRun:
    """A sweep's MLflow parent run and its store: every trial logs a child run of it."""

    uri: str
    experiment: str
    run_id: str


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
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--param {item!r}: expected key=value or key=[v1,v2]")
        value = OmegaConf.from_dotlist([f"v={raw}"])["v"]
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        out[key] = tune.grid_search(list(value)) if isinstance(value, list) else value
    return out


def plain_params(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's values as plain Python (numpy scalars from Tune's samplers as numbers)."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in params.items()}


@dataclass
class TrialRun:
    """A trial's MLflow child run and the highest step of each metric it holds. A trial that runs
    again (restored by a resumed sweep, or re-created by it with the same seeded sample) logs only
    the steps its run lacks: it refits or retrains deterministically to the same values, so each
    metric step is in the run once."""

    uri: str
    run_id: str
    logged: dict[str, int]

    def log(self, metrics: dict[str, Any], step: int) -> None:
        new = {k: v for k, v in metrics.items() if self.logged.get(tracking.metric_name(k), -1) < step}
        tracking.log_metrics(self.uri, self.run_id, new, step=step)
        self.logged.update({tracking.metric_name(k): step for k in new})

    def reread(self) -> None:
        """What the run holds now (after a training logged into it from other processes)."""
        self.logged = tracking.last_logged_steps(self.uri, self.run_id)


def _trial_run(parent: ParentRun, params: dict[str, Any]) -> TrialRun:
    """The trial's child run: reused when a restored sweep restarts the trial, else created. A run
    whose params are not this trial's (a sweep started before sweeps were seeded re-sampled it) is
    deleted and replaced, so that each trial has one child run and it records what the trial ran."""
    context = tune.get_context()
    trial_id = context.get_trial_id()
    values = plain_params(params)
    run_id = tracking.find_run(
        parent.uri, parent.experiment, {"mlflow.parentRunId": parent.run_id, "convsts.trial_id": trial_id}
    )
    if run_id is not None:
        stored = tracking.run_params(parent.uri, run_id) or {}
        differs = sorted(k for k, v in tracking.param_values(values).items() if stored.get(k) != v)
        if differs:
            log.warning(
                "trial %s: its MLflow run %s records other values of %s than this attempt runs with; "
                "that run is deleted and a new one records this attempt",
                trial_id,
                run_id,
                ", ".join(differs),
            )
            tracking.delete_run(parent.uri, run_id)
            run_id = None
    if run_id is None:
        run_id = tracking.start_run(
            parent.uri,
            parent.experiment,
            f"{context.get_trial_name()}",
            values,
            tags={"convsts.job": "tune-trial", "convsts.trial_id": trial_id},
            parent_run_id=parent.run_id,
        )
    run = TrialRun(parent.uri, run_id, tracking.last_logged_steps(parent.uri, run_id))
    # One point per start, at steps 0, 1, ...: a trial that a resumed sweep runs again shows two.
    run.log({STARTED_METRIC: time.time()}, step=run.logged.get(STARTED_METRIC, -1) + 1)
    return run


def _reported_epochs(restored: Checkpoint | None) -> int:
    """The epochs Tune already holds of a trial it restores: it goes on from the iteration of the
    trial's checkpoint (the best epoch so far), so the refit reports only the epochs after it."""
    if restored is None:
        return 0
    with restored.as_directory() as folder:
        transform = load_sts_transform(folder)
    return transform.best_epoch if transform is not None else 0


def sts_matrix_trial(
    params: dict[str, Any],
    embeddings: dict[str, dict[str, np.ndarray]],
    base: dict[str, Any],
    fixed: list[str],
    parent: ParentRun,
) -> None:
    """One fit of the tuned STS matrix on embeddings computed once; each epoch reported to Tune."""
    cfg = trial_config(base, params, fixed)
    run = _trial_run(parent, params)
    reported = _reported_epochs(tune.get_checkpoint())

    def on_epoch(epoch: int, dev_r: float, best: float, new_best: np.ndarray | None) -> None:
        metrics = {"stsb_tuned/dev/pearson": best, "stsb_tuned/dev/pearson_epoch": dev_r, "epoch": epoch}
        run.log(metrics, step=epoch)
        if epoch <= reported:
            return
        if new_best is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:  # the best matrix so far travels with the report
            StsTransform(new_best, cfg.eval.tuned, best, epoch).save(tmp)
            tune.report(metrics, checkpoint=Checkpoint.from_directory(tmp))

    fitted = fit_sts_transform(embeddings["train"], embeddings["dev"], cfg.eval.tuned, on_epoch=on_epoch)
    # The last epoch logged the best dev score at this step already.
    run.log({"stsb_tuned/best_epoch": fitted.best_epoch}, step=cfg.eval.tuned.epochs)
    tracking.end_run(parent.uri, run.run_id)


def train_trial(
    params: dict[str, Any],
    base: dict[str, Any],
    fixed: list[str],
    parent: ParentRun,
    prepared: str,
    trials_dir: str,
) -> None:
    """One multitask training (a TorchTrainer inside the trial, Train V2 style), then evaluation."""
    cfg = trial_config(base, params, fixed)
    run = _trial_run(parent, params)
    trial_id = tune.get_context().get_trial_id()
    # Under the sweep's output folder (Ray's own trial folder lives in its temporary session dir).
    trial_dir = Path(trials_dir) / trial_id
    # The trial's checkpoints: its own folder, keyed by its id, under trainer.storage_path (shared by
    # the sweep's nodes) or else the sweep's trials/ray_results. A retry (FailureConfig) or a
    # resumed sweep restarts the trial from its own last checkpoint there, never from another's.
    cfg.trainer.storage_path = cfg.trainer.storage_path or str(RunFolder(Path(trials_dir)).ray_results)
    try:
        # fresh: the trial's earlier outputs in trial_dir/run (a restart's) are replaced.
        trained = run_training(
            cfg,
            trial_dir / "run",
            run_id=run.run_id,
            prepared_dir=prepared,
            extra_callbacks=[TuneReportCallback()],
            fresh=True,
            storage_key=trial_id,
        )
        results = evaluate(EmbeddingScorer(load(trained.checkpoint), cfg.eval.batch_size), cfg, prepared)
    except BaseException:
        tracking.end_run(parent.uri, run.run_id, "FAILED")
        raise
    results.update({f"data/{name}_train_pairs": float(n) for name, n in trained.train_rows.items()})
    run.reread()
    run.log(results, step=cfg.trainer.steps)
    tracking.end_run(parent.uri, run.run_id)
    tune.report({**results, "checkpoint_dir": str(trained.checkpoint)})


def stsb_embeddings_of(checkpoint: str, cfg: RunConfig) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """(STS-B frames, their embeddings) for train, dev and test."""
    scorer = EmbeddingScorer(load(checkpoint), cfg.eval.batch_size)
    frames = {split: read_stsb_split(cfg, split) for split in ("train", "dev", "test")}
    return frames, {split: stsb_embeddings(scorer, frame) for split, frame in frames.items()}
