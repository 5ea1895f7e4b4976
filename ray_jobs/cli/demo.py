"""`convsts demo --out DIR`: the whole pipeline on the embedded sample, on a local Ray instance.

prepare (Ray Data) -> multitask training (Ray Train, one worker per task) -> checkpoint ->
evaluation (STS-B dev/test raw and tuned, Reddit P@N, SNLI dev, CQA MAP) of the trained encoder,
of the same encoder untrained and of the bag-of-words and TF-IDF baselines -> one MLflow run
(sqlite store in DIR) -> DIR/results.json and a results table.

  convsts demo --out DIR                    # all-MiniLM-L6-v2 fine-tuned (configs/demo.yaml)
  convsts demo --encoder dan --out DIR      # the paper's DAN from scratch (configs/demo_dan.yaml)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from convsts.ray_jobs.config.loader import load_config, parse_with_overrides
from convsts.ray_jobs.pipelines.demo import DEFAULT_ENCODER, DEMO_CONFIGS, run_demo
from convsts.ray_jobs.runtime.logs import setup_logging


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--encoder",
        choices=sorted(DEMO_CONFIGS),
        default=DEFAULT_ENCODER,
        help=f"which demo config: {', '.join(f'{k} = {v.name}' for k, v in DEMO_CONFIGS.items())}",
    )
    parser.add_argument("--config", default=None, help="a run config of your own (replaces --encoder's)")
    parser.add_argument(
        "--fresh", action="store_true", help="replace an earlier demo in --out (its MLflow runs are kept)"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.steps=50")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_with_overrides(build_parser(), argv)  # overrides anywhere on the line (after --resume latest too)
    setup_logging()
    run_demo(load_config(args.config or DEMO_CONFIGS[args.encoder], args.overrides), args.out, fresh=args.fresh)
    return 0
