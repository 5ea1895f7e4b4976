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

from convsts.io.errors import BadInputError
from convsts.io.storage import resolve_path
from convsts.models.checkpoint import read_model_files
from convsts.ray_jobs.config.loader import load_config, parse_with_overrides
from convsts.ray_jobs.evaluation import BASELINES
from convsts.ray_jobs.runtime.logs import setup_logging
from convsts.ray_jobs.runtime.run_folder import RunFolder


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--checkpoint")
    group.add_argument("--baseline", choices=BASELINES)
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
    for checkpoint in [args.checkpoint] if args.checkpoint else args.fraction_curve or []:
        read_model_files(checkpoint)  # a damaged or foreign folder is refused before the library loads
    from convsts.ray_jobs.evaluation.curve import fraction_curve
    from convsts.ray_jobs.pipelines.evaluate import results_table, run_evaluation, training_run

    if args.fraction_curve:
        rows = fraction_curve(args.fraction_curve, cfg, Path(args.out))
        print(pd.DataFrame(rows).to_string(index=False))
        return 0
    prepared = args.prepared
    if prepared is None and args.checkpoint:
        guess = RunFolder(Path(args.checkpoint).resolve().parent).prepared
        prepared = str(guess) if guess.is_dir() else (resolve_path(cfg.data.prepared_dir) or None)
    run_id, uri = args.run_id, None
    if args.checkpoint and run_id is None:
        run_id, uri = training_run(args.checkpoint)
    results = run_evaluation(cfg, args.out, args.checkpoint, args.baseline, prepared, args.sts, run_id, mlflow_uri=uri)
    scores = {k: v for k, v in results.items() if isinstance(v, float)}
    print(results_table({args.baseline or "model": scores}, short=True))
    print(f"every metric: {Path(args.out) / 'results.md'}")
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
    from convsts.ray_jobs.evaluation.compare import write_comparison

    print(write_comparison(Path(args.compare[0]), Path(args.compare[1]), Path(args.out)))
    return 0
