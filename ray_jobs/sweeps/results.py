"""What a finished sweep leaves: the best trial's results and config, trials.csv, the space's table
(mean and spread over seeds) or curve, the fitted STS matrix; the parent run's params, metrics,
files and end; the trials' runs closed."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from convsts.io import storage
from convsts.io.redaction import redact
from convsts.models.sts_transform import file_name as sts_file
from convsts.models.sts_transform import load_sts_transform
from convsts.ray_jobs.evaluation.curve import write_curve
from convsts.ray_jobs.evaluation.plots import COUNT_PREFIX
from convsts.ray_jobs.evaluation.sts import transformed_sts_metrics
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.sweeps.trials import ParentRun, plain_params, trial_config
from convsts.ray_jobs.tracking import runs as tracking
from convsts.tune_spaces import TuneSpace

SEED_KEYS = ("seed", "data.snli_fraction_seed")  # a curve's points: one per value of those searched


class EncodedStsb(NamedTuple):
    """An sts_matrix sweep's STS-B, encoded once: the splits' frames, their embeddings, and the
    checkpoint that encoded them (read only: the tuned matrix goes to the sweep's --out)."""

    frames: dict
    embeddings: dict
    checkpoint: str


def sweep_results(
    grid, best, space: TuneSpace, base: dict, out_dir: Path, encoded: EncodedStsb | None
) -> dict[str, Any]:
    """The best trial's results (and out_dir/best_config.yaml; the fitted matrix or the curve)."""
    best_params = dict(best.config.items())
    storage.write_text(out_dir / "best_config.yaml", redact(trial_config(base, best_params, space.fixed).to_yaml()))
    if encoded is not None:
        results = _sts_matrix_results(best, encoded, out_dir)
    else:
        results = {k: v for k, v in best.metrics.items() if isinstance(v, (int, float)) and "/" in k}
        results["checkpoint"] = best.metrics.get("checkpoint_dir", "")
        rows = _trials_table(grid, space, out_dir)
        if space.curve and rows:  # the space's curve: its report metrics against one of its parameters
            rows = _curve(rows, space, out_dir)
        if (space.table or space.curve) and rows:
            _mean_table(rows, space, out_dir)
    results.update(
        best_trial=Path(best.path).name,
        trials=len(grid),
        trials_failed=sum(r.error is not None for r in grid),
        # The trials' own time over every sitting (Tune's time_total_s); `seconds` is this command's.
        trial_seconds=round(sum(float((r.metrics or {}).get("time_total_s") or 0.0) for r in grid), 1),
    )
    return results


def _sts_matrix_results(best, encoded: EncodedStsb, out_dir: Path) -> dict[str, Any]:
    """Test is scored for the chosen trial only, with the matrix that its best dev epoch produced."""

    with best.checkpoint.as_directory() as folder:
        transform = load_sts_transform(folder)
    if transform is None:
        raise RuntimeError(f"the best trial's checkpoint {best.checkpoint.path} holds no STS matrix")
    results: dict[str, Any] = dict(transformed_sts_metrics(transform, encoded.frames, encoded.embeddings))
    results["checkpoint"] = str(encoded.checkpoint)
    results["sts_matrix"] = str(out_dir / sts_file())  # written once results.json is (save_sweep_matrix)
    return results


def save_sweep_matrix(best, out_dir: Path) -> Path:
    """The chosen trial's matrix in the sweep's --out, beside results.json (written first); the
    checkpoint is only read, whatever its folder or bucket allows: `encode(tuned=<this file>)`
    applies it."""
    with best.checkpoint.as_directory() as folder:
        transform = load_sts_transform(folder)
    assert transform is not None, "the chosen trial's matrix was read for its results"
    path = transform.save(out_dir)
    log.info("the tuned STS matrix: %s (encode(tuned=%r) applies it)", path, str(path))
    return path


def _trials_table(grid, space: TuneSpace, out_dir: Path) -> list[dict[str, Any]]:
    """out_dir/trials.csv: every finished trial of a train sweep, its searched values (one column per
    key of the space) and the space's report metrics, in trial order. A count a trial does not
    report is 0: it trained no pair of that task (Reddit alone reports no SNLI pairs)."""
    searched = sorted(space.params())
    rows = [
        {"trial": Path(r.path).name}
        | {key: _plain_value(r.config.get(key)) for key in searched}
        | {name: r.metrics.get(name, 0.0 if name.startswith(COUNT_PREFIX) else math.nan) for name in space.report}
        for r in sorted(grid, key=lambda r: Path(r.path).name)
        if r.error is None and r.metrics
    ]
    if rows:
        storage.write_text(out_dir / "trials.csv", _csv(rows))
    return rows


def _mean_table(rows: list[dict[str, Any]], space: TuneSpace, out_dir: Path) -> None:
    """out_dir/table.md: a column per value of the space's table parameter (in trial order) or of
    its curve parameter (in the curve's order, titled `snli_fraction 0.1`), a row per report metric,
    each cell the mean and standard deviation over the trials that share the value (their seeds)."""
    key = space.table or space.curve
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    title = "" if space.table else key.rpartition(".")[2] + " "
    labels = [title + _label(value) for value in groups]
    lines = [f"| metric | {' | '.join(labels)} |", "|---" * (len(labels) + 1) + "|"]
    lines.append("| trials | " + " | ".join(str(len(members)) for members in groups.values()) + " |")
    for metric in space.report:
        count = metric.startswith(COUNT_PREFIX)
        cells = (_mean_sd([r[metric] for r in rs], count) for rs in groups.values())
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
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


def _mean_sd(values: list[Any], count: bool = False) -> str:
    """'mean ± sd' of the finite values (sample sd), the value alone for one, '—' for none; a count
    that every trial shares as that whole number."""
    finite = np.array([v for v in values if isinstance(v, (int, float)) and math.isfinite(v)], dtype=np.float64)
    if len(finite) == 0:
        return "—"
    places = 0 if count else 4
    if len(finite) == 1 or (count and np.all(finite == finite[0])):
        return f"{finite[0]:.{places}f}"
    return f"{finite.mean():.{places}f} ± {finite.std(ddof=1):.{places}f}"


def _plain_value(value: Any) -> Any:
    """A searched value as a CSV cell: a list or mapping (trainer.stages) as JSON."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _csv(rows: list[dict[str, Any]]) -> str:
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return table.getvalue()


def _curve(rows: list[dict[str, Any]], space: TuneSpace, out_dir: Path) -> list[dict[str, Any]]:
    """out_dir/curve.csv and curve.png: the space's report metrics against its curve parameter, one
    point per seed (the training seed and the SNLI subset's, those the space searches), from the
    rows of trials.csv; returns the rows in the curve's order."""
    seeds = [key for key in SEED_KEYS if key in rows[0]]
    points = [
        {"fraction": row[space.curve], "seed": "/".join(str(row[k]) for k in seeds) or "0", "trial": row["trial"]}
        | {name: row[name] for name in space.report}
        for row in rows
    ]
    write_curve(points, [m for m in space.report if m.startswith("stsb/")], out_dir)
    return sorted(rows, key=lambda row: (row[space.curve], [row[k] for k in seeds]))


def log_sweep(parent: ParentRun, best, space: TuneSpace, results: dict, out_dir: Path, failed=()) -> None:
    """The parent run: the best trial's params, the results, a tag naming the best child run, the
    files of out_dir; then FINISHED, or FAILED (naming them) when trials failed."""
    uri, run_id = parent.uri, parent.run_id
    best_child = tracking.find_run(
        uri, parent.experiment, {"mlflow.parentRunId": run_id, "convsts.trial_id": best.metrics.get("trial_id", "")}
    )
    tracking.log_params(uri, run_id, {f"best.{k}": v for k, v in plain_params(dict(best.config.items())).items()})
    tracking.log_metrics(uri, run_id, {k: v for k, v in results.items() if "/" in k})
    tracking.set_tags(uri, run_id, {"convsts.best_trial_run": best_child or ""})
    for name in (
        "best_config.yaml",
        "results.json",
        "trials.csv",
        "table.md",
        "curve.png",
        "curve.csv",
        sts_file(),
    ):
        if (out_dir / name).is_file():
            tracking.log_artifact(uri, run_id, str(out_dir / name))
    if (out_dir / "table.md").is_file():  # the run page opens on the space's table
        tracking.describe_run(uri, run_id, f"{space.description}\n\n{(out_dir / 'table.md').read_text()}")
    if failed:
        tracking.set_tags(uri, run_id, {"convsts.failed_trials": ",".join(failed)})
    tracking.end_run(uri, run_id, "FAILED" if failed else "FINISHED")
    value = float(best.metrics.get(space.metric, math.nan))
    log.info(
        "sweep %s: %d trials (%.0f s of trials; this command %.0f s); best %s = %.4f",
        space.name,
        results["trials"],
        results["trial_seconds"],
        results["seconds"],
        space.metric,
        value,
    )


def close_trial_runs(grid, parent: ParentRun, max_t: int = 0) -> list[str]:
    """Ends the trials' MLflow runs that are still RUNNING after the fit: FAILED for a trial that
    failed (its process lost with its node, or an error after every retry), FINISHED for one the
    scheduler stopped, tagged `convsts.stopped_early` unless it had reached `max_t` iterations (ASHA
    stops that one too, as its end: it ran whole). Returns the failed trials' ids."""
    trials = [(str(r.metrics.get("trial_id") or Path(r.path).name), r) for r in grid]
    failed = sorted(trial for trial, r in trials if r.error is not None)
    iterations = {trial: int(r.metrics.get("training_iteration") or 0) for trial, r in trials}
    uri = parent.uri
    for run in tracking.child_runs(uri, parent.experiment, parent.run_id):
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
