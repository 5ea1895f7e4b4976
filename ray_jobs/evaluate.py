"""`convsts evaluate`: metrics of a checkpoint (or a lexical baseline) -> DIR/results.json + table + MLflow.

  convsts evaluate --checkpoint C --out DIR [--sts [NAME=]FILE ...] [--run-id ID] [--config ...]
  convsts evaluate --baseline bow|tfidf --out DIR
  convsts evaluate --compare EVAL_A EVAL_B --out DIR   (paired P@N difference of two evaluations)

Metric names: stsb/<split>/pearson|spearman, stsb/<split>/<genre>/pearson, sts/<name>/pearson and
sts_tuned/<name>/pearson (an --sts file, raw and with STS-B's tuned matrix), snli/<split>/accuracy,
reddit/p_at_1|3|10 (with reddit/queries and P@1's binomial standard error reddit/p_at_1_stderr), cqa2016/map. Primary metric: stsb/dev/pearson.
Each Reddit query's outcome goes to DIR/items/reddit.parquet (and the MLflow run's items/): `--compare A B`
pairs two evaluations on their common queries and candidates (same eval.seed, eval.reddit_pairs,
eval.reddit_negatives and held-out pairs) and gives reddit/p_at_N_diff (A minus B) with its paired
standard error reddit/p_at_N_diff_stderr, far tighter than the two P@1 standard errors together.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from convsts.datasets.storage import BadInputError, resolve_path
from convsts.ray_jobs.config import load_config, parse_with_overrides
from convsts.ray_jobs.evaluation.compare import compare_evaluations
from convsts.ray_jobs.evaluation.curve import fraction_curve
from convsts.ray_jobs.evaluation.harness import results_table, run_evaluation, training_run
from convsts.ray_jobs.evaluation.scorers import LexicalScorer
from convsts.ray_jobs.runtime import setup_logging


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--checkpoint")
    group.add_argument("--baseline", choices=LexicalScorer.KINDS)
    group.add_argument(
        "--fraction-curve",
        nargs="+",
        metavar="CHECKPOINT",
        help="STS-B of several checkpoints against the SNLI fraction each was trained with "
        "(Figure 8): OUT/curve.csv and OUT/curve.png",
    )
    group.add_argument(
        "--compare",
        nargs=2,
        metavar="EVAL_DIR",
        help="two evaluation folders (each an earlier --out) compared query by query: the paired "
        "difference of their Reddit P@N and its standard error -> OUT/compare.json, OUT/compare.md",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=None)
    parser.add_argument("--prepared", default=None, help="prepared shards (Reddit held-out split)")
    parser.add_argument(
        "--sts",
        nargs="*",
        default=[],
        help="other STS sets, as their releases ship them: parquet or JSON lines (MTEB), a table with a header row (SICK, GLUE), the STS Benchmark's sts-*.csv, or an STS 2012-2016 STS.input.<name>.txt beside its STS.gs.<name>.txt; text files plain or .gz/.bz2/.xz/.zst (MTEB's test.jsonl.gz); NAME=FILE puts a file's metrics under sts/NAME/ (default: the file's name, or its folder's where the file is named by its split only)",
    )
    parser.add_argument(
        "--run-id",
        default=None,
        help="MLflow run to log into (default: the run that trained the weights when --checkpoint is a training run's OUT/checkpoint or OUT/model, as its OUT/train.json says; else a new run)",
    )
    parser.add_argument("overrides", nargs="*")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_with_overrides(build_parser(), argv, ("sts", "fraction_curve"))  # overrides may follow --sts A B
    setup_logging()
    if args.compare:
        return compare(args)
    cfg = load_config(args.config, args.overrides)
    if args.fraction_curve:
        rows = fraction_curve(args.fraction_curve, cfg, Path(args.out))
        print(pd.DataFrame(rows).to_string(index=False))
        return 0
    prepared = args.prepared
    if prepared is None and args.checkpoint:
        guess = Path(args.checkpoint).resolve().parent / "prepared"
        prepared = str(guess) if guess.is_dir() else (resolve_path(cfg.data.prepared_dir) or None)
    run_id, uri = args.run_id, None
    if args.checkpoint and run_id is None:
        run_id, uri = training_run(args.checkpoint)
    results = run_evaluation(cfg, args.out, args.checkpoint, args.baseline, prepared, args.sts, run_id, mlflow_uri=uri)
    print(results_table({args.baseline or "model": {k: v for k, v in results.items() if isinstance(v, float)}}))
    print(json.dumps({"results": str(Path(args.out) / "results.json"), "mlflow_run_id": results.get("mlflow_run_id")}))
    return 0


def compare(args: argparse.Namespace) -> int:
    """--compare A B: A's per-query outcomes against B's (convsts.ray_jobs.evaluation.compare)."""
    unused = [
        flag
        for flag, value in (
            ("--prepared", args.prepared),
            ("--sts", args.sts),
            ("--config", args.config),
            ("--run-id", args.run_id),
            ("overrides", args.overrides),
        )
        if value
    ]
    if unused:
        raise BadInputError(f"--compare reads two finished evaluations; {', '.join(unused)} would do nothing")
    a, b = (Path(folder) for folder in args.compare)
    paired = compare_evaluations(a, b)
    results = {name: read_results(folder) for name, folder in zip("ab", (a, b))}
    rows = []
    for name in sorted(
        (k for k in paired if k.endswith("_diff")), key=lambda k: (k.split("/")[0], int(k.rsplit("_", 2)[-2]))
    ):  # reddit/p_at_N_diff: N = 1, 3, 10
        metric = name[: -len("_diff")]
        rows.append(
            f"| {metric} | {_cell(results['a'].get(metric))} | {_cell(results['b'].get(metric))} | "
            f"{paired[name]:+.4f} | {paired[name + '_stderr']:.4f} |"
        )
    queries = "; ".join(
        f"{k.split('/')[0]}: {v:.0f} queries" for k, v in paired.items() if k.endswith("/paired_queries")
    )
    table = "\n".join(
        [
            f"A = {a}",
            f"B = {b}",
            "",
            "| metric | A | B | A - B | paired stderr |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"paired on the same queries and candidates ({queries})",
        ]
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps({"a": str(a), "b": str(b), **paired}, indent=2), encoding="utf-8")
    (out / "compare.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


def read_results(folder: Path) -> dict:
    """An evaluation folder's results.json ({} when it has none: the table then shows only the differences)."""
    path = folder / "results.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError as err:
        raise BadInputError(f"{path}: not JSON ({err})") from None
    return data if isinstance(data, dict) else {}


def _cell(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "—"


if __name__ == "__main__":
    from convsts.ray_jobs.runtime import run_main

    raise SystemExit(run_main("evaluate", main))
