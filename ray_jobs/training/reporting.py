"""What a training run reports beside its metrics: its prepared datasets as MLflow dataset inputs,
and its loss curves along OUT's chain as a plot in OUT and in MLflow."""

from __future__ import annotations

from pathlib import Path

from convsts.io import storage
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.evaluation.plots import loss_curves_plot
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.tasks import prepared_tasks
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training.lineage import chain_runs


def log_prepared_datasets(cfg: RunConfig, prepared: str, manifests: dict, digests: dict, uri: str, run_id: str) -> None:
    """The training data as MLflow dataset inputs: digest, source folder and the manifest's counts."""
    profile_keys = ("pairs", "train_pairs", "test_pairs", "inputs", "input")
    tracking.log_datasets(
        uri,
        run_id,
        {
            name: {
                "digest": digests[name],
                "source": storage.join(task.prepared_dir(prepared), "train"),
                "profile": {k: manifests[name].get(k) for k in profile_keys if manifests[name].get(k) is not None},
            }
            for name, task in prepared_tasks(cfg).items()
            if name in manifests
        },
    )


def log_loss_curves(cfg: RunConfig, uri: str, run_id: str, out_dir: Path) -> None:
    """OUT/loss_curves.png from the per-task metric history along OUT's chain up to this run
    (lineage.chain_runs: each run logged the steps no run before it had), logged under plots/. A run
    the store no longer has adds no points."""
    c = tracking.client(uri)
    path = RunFolder(out_dir).loss_curves
    path.unlink(missing_ok=True)  # an earlier run's plot is never shown as this run's
    names = [f"{task}/{m}" for task in cfg.trainer.task_weights for m in ("loss", "batch_accuracy")]
    chain = [r for r in chain_runs(out_dir, run_id) if tracking.run_status(uri, r)]
    histories = {}
    for n in names:
        points = {m.step: m.value for earlier in chain for m in c.get_metric_history(earlier, n)}  # newest last
        histories[n] = sorted((step, value) for step, value in points.items() if step <= cfg.trainer.steps)
    if not any(histories.values()):
        return
    loss_curves_plot(
        histories,
        path,
        f"{cfg.name}: {cfg.model.encoder}, {cfg.trainer.steps} steps, "
        f"{cfg.trainer.workers_text()} workers, {cfg.trainer.task_split}",
    )
    tracking.log_artifact(uri, run_id, str(path), "plots")
