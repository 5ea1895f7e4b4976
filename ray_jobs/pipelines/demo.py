"""The demo end to end (the library behind `convsts demo`): prepare the embedded sample, train,
evaluate, then score the same encoder untrained and the lexical baselines on the same data, and
write the comparison (results.json, results.md, the MLflow run).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convsts.io import storage
from convsts.io.dotted import flatten
from convsts.io.errors import BadInputError
from convsts.io.redaction import redact_tree
from convsts.models.checkpoint import read_model_files, save_checkpoint
from convsts.models.encoders import DanEncoder, PretrainedEncoder
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.evaluation.compare import ITEMS_DIR, compare_evaluations
from convsts.ray_jobs.evaluation.scorers import LexicalScorer
from convsts.ray_jobs.pipelines.evaluate import PRIMARY_METRIC, results_document, results_table, run_evaluation
from convsts.ray_jobs.pipelines.inputs import prepare_all
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.output_lock import holds_output
from convsts.ray_jobs.runtime.ray_start import ensure_ray
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.runtime.tracking_store import tracking_uri
from convsts.ray_jobs.tasks import prepared_tasks
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training.driver import run_training
from convsts.ray_jobs.training.lineage import decide_start, remove_earlier_outputs
from convsts.ray_jobs.training.start_weights import initial_model

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


DEMO_CONFIGS = {
    PretrainedEncoder.name: CONFIGS / "demo.yaml",
    DanEncoder.name: CONFIGS / "demo_dan.yaml",
}  # --encoder: its config


DEFAULT_ENCODER = PretrainedEncoder.name


@holds_output("demo")  # one run at a time in out_dir, for the whole run
def run_demo(
    cfg: RunConfig, out_dir: str | Path, baselines: Sequence[str] = LexicalScorer.KINDS, fresh: bool = False
) -> dict[str, object]:
    """Prepare, train, evaluate and compare into out_dir. An out_dir that holds an earlier demo is
    refused before any work, unless `fresh`: its training run's outputs are then removed (its
    MLflow store and runs are kept, and its prepared sample is kept when it verifies)."""
    started, out_dir = time.time(), Path(out_dir).resolve()
    uri = claim_demo_output(cfg, out_dir, fresh)
    prepared = RunFolder(out_dir).prepared
    manifests = prepare_sample(cfg, prepared, fresh)
    run_id = tracking.start_run(
        uri,
        cfg.mlflow.experiment,
        cfg.mlflow.run_name or cfg.name,
        flatten(cfg.to_dict()),
        tags={"convsts.job": "demo"},
    )
    tasks = prepared_tasks(cfg)
    for name, manifest in manifests.items():
        tracking.log_metrics(uri, run_id, tasks[name].manifest_metrics(manifest))
    log.info(
        "[2/4] training %s for %d steps with Ray Train (%s workers)",
        cfg.model.encoder,
        cfg.trainer.steps,
        cfg.trainer.workers_text(),
    )
    try:
        trained = run_training(cfg, out_dir, run_id=run_id, prepared_dir=prepared, mlflow_uri=uri)
        log.info("[3/4] evaluating %s", trained.checkpoint)
        results = run_evaluation(
            cfg,
            out_dir / "eval",
            checkpoint=str(trained.checkpoint),
            prepared_dir=prepared,
            run_id=run_id,
            mlflow_uri=uri,
        )
        columns = {f"{cfg.model.encoder}, {cfg.trainer.steps} steps": _floats(results)}
        columns.update(evaluate_references(cfg, out_dir, trained.checkpoint, prepared, baselines))
        flat = write_results(cfg, out_dir, columns, uri, run_id)
        flat.update(checkpoint=str(trained.checkpoint), mlflow_run_id=run_id, seconds=round(time.time() - started, 1))
        storage.write_results(out_dir / "results.json", flat)
        tracking.log_artifact(uri, run_id, str(out_dir / "results.json"))
        tracking.log_artifact(uri, run_id, str(out_dir / "results.md"))
        tracking.log_metrics(uri, run_id, {"demo/seconds": flat["seconds"]})
        tracking.end_run(uri, run_id)
    except BaseException as err:
        tracking.end_run(uri, run_id, tracking.ended_status(err))
        raise
    print_summary(out_dir, flat, uri, columns)
    return flat


def claim_demo_output(cfg: RunConfig, out_dir: Path, fresh: bool) -> str:
    """out_dir for this demo (an earlier demo there is refused unless `fresh`, which removes its
    training outputs); Ray started; returns the tracking store's URI."""
    earlier = RunFolder(out_dir).run_outputs()
    if earlier and not fresh:
        raise FileExistsError(
            f"{out_dir} already holds a demo run ({', '.join(p.name for p in earlier)}): pass "
            f"--fresh to replace it (its MLflow runs are kept), or another --out"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri(cfg.mlflow.tracking_uri, out_dir)
    # With --fresh: the earlier run's checkpoints go before this run starts.
    remove_earlier_outputs(decide_start(out_dir, cfg, fresh))
    ensure_ray()
    return uri


def prepare_sample(cfg: RunConfig, prepared: Path, fresh: bool) -> dict[str, dict]:
    """Step 1: the embedded sample prepared into `prepared` (with `fresh`, an earlier demo's sample
    prepared with other data settings is prepared again)."""
    log.info("[1/4] preparing the embedded sample -> %s", prepared)
    try:
        return prepare_all(cfg, str(prepared))
    except BadInputError as err:  # the earlier demo's sample, prepared with other data settings
        if not fresh:
            raise
        log.info("--fresh: %s; removed, prepared again", err)
        shutil.rmtree(prepared)
        return prepare_all(cfg, str(prepared))


def _floats(results: dict) -> dict[str, float]:
    return {k: v for k, v in results.items() if isinstance(v, float)}


def evaluate_references(
    cfg: RunConfig, out_dir: Path, checkpoint: Path, prepared: Path, baselines: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Step 4: {column: metrics} of the same encoder untrained and of each lexical baseline."""
    log.info("[4/4] the same encoder untrained (trainer.steps=0) and the baselines: %s", ", ".join(baselines))
    untrained = save_untrained(cfg, checkpoint, out_dir / "untrained")
    columns = {
        UNTRAINED: _floats(
            run_evaluation(
                cfg, out_dir / "eval_untrained", checkpoint=str(untrained), prepared_dir=prepared, log_to_mlflow=False
            )
        )
    }
    for name in baselines:
        columns[name] = _floats(
            run_evaluation(cfg, out_dir / f"baseline_{name}", baseline=name, prepared_dir=prepared, log_to_mlflow=False)
        )
    return columns


def write_results(cfg: RunConfig, out_dir: Path, columns: dict, uri: str, run_id: str) -> dict[str, Any]:
    """The trained encoder's metrics with its paired gain over the untrained encoder, and the
    references' under untrained/ and baseline/<name>/: results.md and the MLflow run; returns them flat."""
    trained_name = next(iter(columns))
    # The gain over the untrained encoder on the same queries, with its paired standard error.
    evaluations = (out_dir / "eval", out_dir / "eval_untrained")
    paired = (
        compare_evaluations(*evaluations, suffix=f"minus_{UNTRAINED}")
        if all((e / ITEMS_DIR).is_dir() for e in evaluations)
        else {}
    )  # none without a Reddit held-out split
    columns[trained_name].update(paired)
    flat: dict[str, object] = dict(columns[trained_name])
    for name, metrics in columns.items():
        if name != trained_name:
            prefix = f"{UNTRAINED}/" if name == UNTRAINED else f"baseline/{name}/"
            flat.update({prefix + k: v for k, v in metrics.items()})
            log_reference_run(cfg, uri, run_id, name, metrics)
    tracking.log_metrics(uri, run_id, paired, cfg.trainer.steps)  # the model's gain, at its last step
    table = results_document(columns)
    storage.write_text(out_dir / "results.md", table + "\n")
    tracking.describe_run(uri, run_id, table)  # the run page opens on its results
    return flat


def log_reference_run(cfg: RunConfig, uri: str, parent_run_id: str, name: str, metrics: dict) -> str:
    """A system the model is compared with (the untrained encoder, a baseline) as a child run of the
    demo's run, its metrics under their own names at the model's last step: the model's run holds the
    model's metrics only, and MLflow's compare view shows the systems side by side."""
    kind = "untrained encoder" if name == UNTRAINED else f"baseline {name}"
    child = tracking.start_run(
        uri,
        cfg.mlflow.experiment,
        f"{cfg.mlflow.run_name or cfg.name} / {kind}",
        tags={"convsts.job": "reference", "convsts.reference": name},
        parent_run_id=parent_run_id,
    )
    tracking.log_metrics(uri, child, metrics, cfg.trainer.steps)
    tracking.describe_run(uri, child, f"{kind}, scored beside the demo's model\n\n{results_document({name: metrics})}")
    tracking.end_run(uri, child)
    return child


def print_summary(out_dir: Path, flat: dict, uri: str, columns: dict) -> None:
    """The headline rows and where everything is (results.md has every metric)."""
    print()
    print(results_table(columns, short=True))
    print()
    print(f"every metric:   {out_dir / 'results.md'}")
    print(f"primary metric {PRIMARY_METRIC}: {flat.get(PRIMARY_METRIC, float('nan')):.4f}")
    print(f"results:        {out_dir / 'results.json'}")
    print(f"checkpoint:     {flat['checkpoint']}")
    print(f"MLflow run id:  {flat['mlflow_run_id']}")
    print(f"MLflow UI:      {tracking.ui_command(uri)}")
    experiment = tracking.client(uri).get_run(str(flat["mlflow_run_id"])).info.experiment_id
    print(f"then open:      http://127.0.0.1:5000/{tracking.run_page(experiment, str(flat['mlflow_run_id']))}")
    print(f"took {flat['seconds']:.0f} s")


UNTRAINED = "untrained"  # results.json key prefix and table column of the encoder before training


def save_untrained(cfg: RunConfig, trained_checkpoint: str | Path, path: Path) -> Path:
    """The checkpoint `trainer.steps=0` would save, without a second Ray Train job: the run's own
    initial weights (seeded, or pretrained) with the trained checkpoint's tokenizer."""
    tokenizer = read_model_files(trained_checkpoint).tokenizer
    untrained = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, steps=0))
    return save_checkpoint(path, initial_model(cfg, tokenizer), tokenizer, redact_tree(untrained.to_dict()))
