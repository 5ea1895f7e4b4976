"""Runs every benchmark on one scorer: STS-B raw and tuned, extra STS files, each task's own metrics
(ray_jobs/tasks/), CQA; writes results.json, results.md and the Figure-7 scatter, logs to MLflow."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from convsts.datasets.evalsets import check_sts_entries, pair_keys
from convsts.io import storage, tables
from convsts.io.errors import BadInputError, TrackingError
from convsts.io.redaction import redact
from convsts.models.checkpoint import read_meta, save_sts_matrix, verified_folder
from convsts.models.sentence_encoder import load
from convsts.models.sts_transform import load_sts_transform
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.evaluation.compare import ITEMS_DIR, write_items
from convsts.ray_jobs.evaluation.cqa import configured_cqa_metrics
from convsts.ray_jobs.evaluation.plots import scatter_plot
from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer, LexicalScorer
from convsts.ray_jobs.evaluation.sts import (
    predicted_scores,
    read_stsb_split,
    sts_file_metrics,
    sts_metrics,
    stsb_embeddings,
    tuned_sts_metrics,
)
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.runtime.tracking_store import tracking_uri
from convsts.ray_jobs.tasks import get_task, model_heads
from convsts.ray_jobs.tasks.prepared_folder import MANIFEST, config_value, settings_mismatches, verify_prepared
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.tracking.mlflow_model import log_model  # imports mlflow.pyfunc: only when a model is logged
from convsts.ray_jobs.tracking.model_card import CARD_FILE, FACTS_FILE, add_results

PRIMARY_METRIC = "stsb/dev/pearson"


def evaluated_tasks(cfg: RunConfig):
    """Every built-in task and every task the config trains: each contributes its own metrics."""
    return [get_task(name, cfg.task_modules) for name in model_heads(cfg)]


class EvalProgress:
    """`[eval] NAME i/N: what` as each benchmark starts, with the time so far and an estimate of the
    rest (the benchmarks done so far as the pace), so that a long evaluation is never silent."""

    def __init__(self, name: str, total: int):
        self.name, self.total, self.done_count, self.started = name, total, 0, time.time()

    def __call__(self, what: str) -> None:
        spent = time.time() - self.started
        left = (
            f", about {spent / self.done_count * (self.total - self.done_count):.0f} s left" if self.done_count else ""
        )
        self.done_count += 1
        log.info("[eval] %s %d/%d: %s (%.0f s so far%s)", self.name, self.done_count, self.total, what, spent, left)

    def done(self) -> None:
        log.info("[eval] %s: %d benchmark(s) in %.0f s", self.name, self.done_count, time.time() - self.started)


def evaluate(
    scorer,
    cfg: RunConfig,
    prepared_dir: str | None,
    sts_sets: dict[str, str] | None = None,
    transform_dirs: Sequence[Path] = (),
    items_dir: Path | None = None,
) -> dict[str, float]:
    """All metrics of one scorer; `sts_sets`: other STS files, {path: name} (check_sts_entries). The
    tuned STS matrix (embedding scorers only) is saved in each of `transform_dirs`; each task's
    per-item outcomes (Task.evaluate_items) in `items_dir`/<task>.parquet (convsts.ray_jobs.evaluation.compare)."""
    results: dict[str, float] = {}
    names, tasks = sts_sets or {}, evaluated_tasks(cfg)
    tuned_on = cfg.eval.tuned.enabled and isinstance(scorer, EmbeddingScorer)
    stage = EvalProgress(scorer.name, 1 + tuned_on + len(names) + len(tasks) + bool(cfg.data.cqa_test))
    stage("STS Benchmark dev and test")
    frames = {split: read_stsb_split(cfg, split) for split in ("dev", "test")}
    embedded = {split: stsb_embeddings(scorer, frame) for split, frame in frames.items()}
    for split, frame in frames.items():
        results.update(sts_metrics(scorer, frame, f"stsb/{split}", embedded=embedded[split]))
    transform = None
    if tuned_on:
        stage(f"the tuned STS matrix ({cfg.eval.tuned.epochs} epochs on STS-B train)")
        try:
            frames["train"] = read_stsb_split(cfg, "train")
        except FileNotFoundError as err:
            log.warning("no tuned STS metrics: %s", err)
        else:
            tuned, transform = tuned_sts_metrics(scorer, cfg, frames, embedded)
            results.update(tuned)
            for folder in transform_dirs:
                replaced = load_sts_transform(folder) is not None
                path = save_sts_matrix(folder, transform)
                if replaced:
                    log.info("replaced the tuned STS matrix in %s (dev r %.4f)", path, transform.dev_pearson)
    # The pairs the matrix was fitted and selected on, once for every --sts file.
    fitted = set(pair_keys(pd.concat([frames["train"], frames["dev"]]))) if transform is not None and names else set()
    for sts_path, name in names.items():
        stage(f"STS set {name}")
        results.update(sts_file_metrics(scorer, sts_path, name, transform, fitted))
    for task in tasks:
        stage(f"task {task.name}")
        metrics, items = task.evaluate_items(scorer, cfg, prepared_dir)
        results.update(metrics)
        if items is not None and items_dir is not None:
            write_items(items_dir, task.name, items)
    if cfg.data.cqa_test:
        stage(f"{cfg.data.cqa_name} (community question answering)")
    results.update(configured_cqa_metrics(scorer, cfg))
    stage.done()
    bad = sorted(k for k, v in results.items() if not np.isfinite(v))
    results["eval/nonfinite_metrics"] = float(len(bad))  # flagged in MLflow too (non-finite values are not logged)
    if bad:
        log.warning(
            "%d metric(s) are NaN (non-finite embeddings or scores, or a constant prediction): %s",
            len(bad),
            ", ".join(bad[:8]) + (" ..." if len(bad) > 8 else ""),
        )
    return results


def baseline_scorer(kind: str, cfg: RunConfig, prepared_dir: str | None) -> LexicalScorer:
    """A lexical baseline whose document frequencies come from STS-B and the held-out task pairs."""
    fit: list[str] = []
    for split in ("train", "dev", "test"):
        try:
            frame = read_stsb_split(cfg, split)
        except FileNotFoundError:
            continue
        fit += list(frame["sentence1"]) + list(frame["sentence2"])
    for task in evaluated_tasks(cfg):
        test_dir = (
            storage.join(task.prepared_dir(prepared_dir), "test") if prepared_dir and "test" in task.splits else None
        )
        if test_dir and storage.is_dir(test_dir):
            table = tables.read_parquet_table(test_dir, columns=list(task.pair))
            for column in task.pair:
                fit += [str(t) for t in table.column(column).to_pylist()]
    return LexicalScorer(kind, fit)


# Groups of the results table, in reading order: (title, metric-name prefixes).
TABLE_GROUPS = (
    ("STS Benchmark, raw cosine", ("stsb/",)),
    ("STS Benchmark, tuned STS matrix", ("stsb_tuned/",)),
    ("other STS sets, raw cosine", ("sts/",)),
    ("other STS sets, STS-B's tuned matrix", ("sts_tuned/",)),
    ("retrieval", ("reddit/",)),
    ("classification", ("snli/",)),
    ("community QA", ("cqa",)),
)
SPLIT_ORDER = {"dev": 0, "test": 1, "train": 2}


def _table_order(name: str) -> tuple:
    """Within a group: dev before test, the overall score before the genres, pearson before spearman;
    an other STS set's score over all its pairs before its splits'."""
    parts = name.split("/")
    whole = -1 if parts[0] in ("sts", "sts_tuned") else 3  # sts/<set>/pearson, then sts/<set>/<split>/pearson
    split = next((SPLIT_ORDER[p] for p in parts if p in SPLIT_ORDER), whole)
    genre = parts[2] if len(parts) == 4 else ""
    rank = re.search(r"p_at_(\d+)", parts[-1])  # p_at_3 (and p_at_3_*) before p_at_10, other metrics after
    return (split, genre != "", genre, parts[-1] != "pearson", int(rank.group(1)) if rank else 10**6, name)


# The rows of the console's short table (results.md keeps every metric): STS-B, Reddit P@N with the
# paired gain over the untrained encoder, SNLI, and any CQA MAP.
HEADLINE_METRICS = (
    "stsb/dev/pearson",
    "stsb/test/pearson",
    "stsb_tuned/test/pearson",
    "reddit/p_at_1",
    "reddit/p_at_1_minus_untrained",
    "reddit/p_at_10",
    "snli/dev/accuracy",
)


def headline(name: str) -> bool:
    return name in HEADLINE_METRICS or (name.endswith("/map") and name.count("/") == 1)


def results_table(columns: dict[str, dict[str, float]], short: bool = False) -> str:
    """Markdown: the metrics grouped (STS-B raw and tuned by split and genre, other STS sets,
    retrieval, classification, CQA), one column per system (model first, then the others);
    `short`: the headline rows only (HEADLINE_METRICS), without group titles."""
    names = {k for r in columns.values() for k, v in r.items() if isinstance(v, (int, float))}
    lines = ["| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    if short:
        order = {name: i for i, name in enumerate(HEADLINE_METRICS)}
        rows = sorted((n for n in names if headline(n)), key=lambda n: (order.get(n, len(order)), n))
        return "\n".join(lines + [_table_row(name, columns) for name in rows])
    shown = set()
    for title, prefixes in TABLE_GROUPS:
        group = sorted((n for n in names if n.startswith(prefixes)), key=_table_order)
        if not group:
            continue
        lines.append(f"| **{title}** |" + " |" * len(columns))
        lines += [_table_row(name, columns) for name in group]
        shown.update(group)
    rest = sorted(n for n in names - shown if not n.startswith(("eval/", "data/", "train/")))
    lines += [_table_row(name, columns) for name in rest]
    return "\n".join(lines)


COUNT_METRICS = (
    "queries",
    "paired_queries",
    "pairs",
    "best_epoch",
)  # the last part of a metric that counts: shown whole


def results_document(columns: dict[str, dict[str, float]]) -> str:
    """results.md and the MLflow run's description: the headline rows first (what the run page
    shows at the top), then every metric grouped."""
    return f"**Headline**\n\n{results_table(columns, short=True)}\n\n**All metrics**\n\n{results_table(columns)}"


def _table_row(name: str, columns: dict[str, dict[str, float]]) -> str:
    fmt = "{:.0f}" if name.rsplit("/", 1)[-1] in COUNT_METRICS else "{:.4f}"
    cells = [
        fmt.format(r[name]) if isinstance(r.get(name), (int, float)) and np.isfinite(r[name]) else "—"
        for r in columns.values()
    ]
    return f"| {name} | " + " | ".join(cells) + " |"


def run_evaluation(
    cfg: RunConfig,
    out_dir: str | Path,
    checkpoint: str | None = None,
    baseline: str | None = None,
    prepared_dir: str | Path | None = None,
    sts_files: Sequence[str] = (),
    run_id: str | None = None,
    log_to_mlflow: bool = True,
    mlflow_uri: str | None = None,
) -> dict[str, object]:
    out_dir = Path(out_dir)
    if not (checkpoint or baseline):
        raise ValueError("give --checkpoint or --baseline")
    sts_sets = check_sts_entries(
        sts_files
    )  # a missing --sts file or a clash of names is refused before anything is made
    prepared = str(prepared_dir) if prepared_dir else None
    scorer, local, meta = evaluation_scorer(cfg, checkpoint, baseline, prepared)
    uri = (
        (mlflow_uri or tracking_uri(cfg.mlflow.tracking_uri, out_dir)) if log_to_mlflow else None
    )  # before the scoring
    out_dir.mkdir(parents=True, exist_ok=True)  # once the model loads: a refused checkpoint leaves no folder behind
    trained = training_info(checkpoint) if checkpoint else {}
    cards = [c for c in model_folders(checkpoint, trained) if _writable(c)] if checkpoint else []
    # The tuned matrix goes beside a local checkpoint we may write into; else (a URI, a read-only
    # folder) to out_dir only.
    beside = [local] if checkpoint and local is not None and not storage.is_uri(checkpoint) and _writable(local) else []
    shutil.rmtree(
        out_dir / ITEMS_DIR, ignore_errors=True
    )  # an earlier evaluation's into this --out: never compared as this one's
    results = evaluate(scorer, cfg, prepared, sts_sets, [out_dir, *beside, *cards], items_dir=out_dir / ITEMS_DIR)
    for folder in cards:
        add_results(folder, results)
        log.info("model card %s: results added", folder / CARD_FILE)
    step = trained_step(local) if checkpoint else 0  # the training step of the weights scored
    label = model_label(checkpoint, meta, step) if checkpoint else scorer.name
    plots = stsb_test_plots(scorer, cfg, out_dir, results, label)
    flat: dict[str, object] = dict(results)
    if checkpoint:
        flat["checkpoint"] = str(checkpoint)
    table = results_document({scorer.name: results})
    storage.write_text(out_dir / "results.md", table + "\n")
    storage.write_results(out_dir / "results.json", flat)  # before MLflow: never lost to it
    if uri is None:  # not logged to MLflow
        return flat
    try:
        run = EvaluationRun(uri, run_id, step, trained, cards)
        flat["mlflow_run_id"] = log_evaluation(run, cfg, scorer.name, checkpoint, baseline, results, plots, out_dir)
        tracking.describe_run(uri, str(flat["mlflow_run_id"]), f"Evaluation of {label}\n\n{table}")  # opens on it
    except Exception as err:
        detail = redact(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
        raise TrackingError(
            f"the results are in {out_dir / 'results.json'} and results.md; the MLflow store {redact(uri or '')} did "
            f"not take them ({type(err).__name__}: {detail})"
        ) from err
    storage.write_results(out_dir / "results.json", flat)  # with its MLflow run
    return flat


def evaluation_scorer(cfg: RunConfig, checkpoint: str | None, baseline: str | None, prepared: str | None):
    """(the scorer, the checkpoint's local folder, its meta) once the prepared folders the evaluation
    reads are verified (a half-written folder is refused, not scored; a checkpoint trained on the
    held-out rows too is refused)."""
    local: Path | None = None
    meta: dict[str, Any] = {}
    if checkpoint:
        local = verified_folder(checkpoint)  # a URI's files copied here once; checked against its manifest
        meta = read_meta(local)
    if prepared:
        for task in evaluated_tasks(cfg):
            if storage.is_dir(task.prepared_dir(prepared)):
                manifest = verify_prepared(task, prepared)
                if checkpoint:
                    check_held_out(task, manifest, prepared, checkpoint, meta)
    if local is not None:
        return EmbeddingScorer(load(local), cfg.eval.batch_size), local, meta
    return baseline_scorer(str(baseline), cfg, prepared), None, None


def stsb_test_plots(scorer, cfg: RunConfig, out_dir: Path, results: dict, label: str) -> list[Path]:
    """STS-B test scatter plots: raw cosine, and with the tuned matrix when one was fitted."""
    test = read_stsb_split(cfg, "test")
    embedded = stsb_embeddings(scorer, test)
    plots = [out_dir / "stsb_test_scatter.png"]
    scatter_plot(predicted_scores(embedded), test, plots[0], f"STS-B test, {label}, raw cosine")
    tuned = isinstance(scorer, EmbeddingScorer) and "stsb_tuned/test/pearson" in results
    transform = load_sts_transform(out_dir) if tuned else None
    if transform is not None:
        plots.append(out_dir / "stsb_test_scatter_tuned.png")
        scores = transform.score(embedded["u"], embedded["v"])
        scatter_plot(scores, test, plots[1], f"STS-B test, {label}, tuned STS matrix")
    return plots


@dataclass
class EvaluationRun:
    """Where an evaluation logs: the store, the run (None: a run of its own), the training step of
    the weights scored, the training run's facts and the model folders given results."""

    uri: str
    run_id: str | None
    step: int
    trained: dict[str, Any]
    cards: list[Path]


def log_evaluation(
    run: EvaluationRun, cfg: RunConfig, name: str, checkpoint, baseline, results: dict, plots: list[Path], out_dir: Path
) -> str:
    """The metrics (against the training step of the weights scored), plots and items in the MLflow
    run; the training run's model brought up to date with its results; returns the run id."""
    uri = run.uri
    own_run = run.run_id is None
    if run.run_id is not None:
        run_id = run.run_id
    else:
        run_id = tracking.start_run(
            uri,
            cfg.mlflow.experiment,
            f"evaluate-{name}",
            {"checkpoint": checkpoint or "", "baseline": baseline or ""},
            tags={"convsts.job": "evaluate"},
        )
    tracking.log_metrics(uri, run_id, results, run.step)
    for plot in plots:
        tracking.log_artifact(uri, run_id, str(plot), "plots")
    if (out_dir / ITEMS_DIR).is_dir():
        tracking.log_artifacts(uri, run_id, str(out_dir / ITEMS_DIR), ITEMS_DIR)
    model = run.trained.get("model")
    if (
        run.trained.get("mlflow_run_id") == run_id
        and model
        and Path(model).resolve() in {c.resolve() for c in run.cards}
    ):
        log_model(uri, run_id, model, step=run.step)  # the training run's model, now with its results and STS matrix
    if own_run:
        tracking.end_run(uri, run_id)
    return run_id


def check_held_out(task, manifest: dict[str, object], prepared: str, checkpoint: str, meta: dict[str, Any]) -> None:
    """A checkpoint is scored on held-out rows split as in its own training run (Task.split_keys):
    a folder split otherwise may hold out rows the checkpoint trained on, so it is refused. `meta`:
    the checkpoint's config.json (convsts.models.checkpoint.read_meta)."""
    trained = meta.get("run_config", {})
    if task.name not in trained.get("trainer", {}).get("task_weights", {}):
        return
    recorded = tuple(k for k in task.split_keys if config_value(trained, k) is not None)  # the keys it records
    differs = settings_mismatches(task, manifest, trained, recorded, label=f"{checkpoint} trained with")
    if differs:
        raise BadInputError(
            f"{storage.join(task.prepared_dir(prepared), MANIFEST)}: held out with {'; '.join(differs)}; "
            f"its held-out rows may be in the checkpoint's training data: evaluate on a folder split "
            f"as the checkpoint's run was"
        )


def model_label(checkpoint: str, meta: dict[str, Any], step: int) -> str:
    """A checkpoint's name for plots: its run name (from `meta`, its config.json), encoder and training steps."""
    return (
        f"{meta.get('run_config', {}).get('name') or Path(checkpoint).name} ({meta['model']['encoder']}, {step} steps)"
    )


def trained_step(checkpoint: str) -> int:
    """The training step of a checkpoint's weights: config.json's "step" (every checkpoint and model
    folder a run writes), else the steps its run config asked for (a folder saved by hand)."""

    meta = read_meta(checkpoint)
    if "step" in meta:
        return int(meta["step"])
    return int(meta.get("run_config", {}).get("trainer", {}).get("steps", 0))


def training_info(checkpoint: str) -> dict[str, str]:
    """The train.json of the training job whose final weights `checkpoint` holds: its OUT/checkpoint,
    or OUT/model (the same weights without optimizer state); {} for any other folder (OUT/best_checkpoint
    holds other weights)."""
    info = RunFolder(Path(checkpoint).resolve().parent).train_summary
    if not info.is_file():
        return {}
    again = f"restore or delete it to evaluate {checkpoint}"
    try:
        data = json.loads(info.read_text(encoding="utf-8"))
    except ValueError as err:
        raise BadInputError(f"{info}: not JSON ({err}); {again}") from None
    if not isinstance(data, dict):
        raise BadInputError(f"{info}: not the JSON object `convsts train` writes; {again}")
    final = [Path(data[key]).resolve() for key in ("checkpoint", "model") if data.get(key)]
    return data if Path(checkpoint).resolve() in final else {}


def _writable(folder: Path) -> bool:
    """Whether this process may write into `folder` (tried: permissions, a read-only file system or
    an immutable folder all say no); said once when it may not."""
    if storage.writable(folder):
        return True
    log.info("%s is read-only: the tuned STS matrix and the model card's results go to --out only", folder)
    return False


def model_folders(checkpoint: str, trained: dict[str, str]) -> list[Path]:
    """Model folders whose card takes this evaluation: the evaluated folder itself when it is one,
    and the model folder its training run wrote beside it."""
    found = [Path(checkpoint)] if (Path(checkpoint) / FACTS_FILE).is_file() else []
    if trained.get("model") and (Path(trained["model"]) / FACTS_FILE).is_file():
        found.append(Path(trained["model"]))
    return list({folder.resolve(): folder for folder in found}.values())  # OUT/model evaluated itself: once


def training_run(checkpoint: str) -> tuple[str | None, str | None]:
    """(run id, tracking URI) of the training job that wrote `checkpoint`, from its train.json."""
    data = training_info(checkpoint)
    return data.get("mlflow_run_id"), data.get("tracking_uri")
