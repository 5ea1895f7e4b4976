"""`convsts tune`: Ray Tune sweeps over a named space from tune_spaces/, reviewed in MLflow.

  convsts tune --space sts_matrix --checkpoint C --out DIR
  convsts tune --space snli_fraction --reddit-checkpoint C --out DIR [--prepared P]
  convsts tune ... --param data.snli_fraction=[0.5,1.0] --num-samples 4 [dotted.overrides ...]

A trial is the run config (`--config` + overrides) plus the space's sampled dotted keys. One
MLflow parent run per sweep, one child run per trial. The best trial (on the space's dev metric)
gives DIR/results.json and DIR/best_config.yaml. Rerunning the same command after an interruption
resumes the sweep (Tuner.restore) without rerunning finished trials; `--fresh` starts over.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from convsts.io.errors import ConfigError
from convsts.io.redaction import redact
from convsts.ray_jobs.config.loader import load_config, parse_with_overrides
from convsts.ray_jobs.runtime.logs import setup_logging
from convsts.ray_jobs.sweeps.request import SweepInterrupted, SweepRequest, SweepTrialsFailed, sweep_inputs
from convsts.tune_spaces import get_space


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--space", required=True, help="a name in tune_spaces/ or package.module:ATTRIBUTE")
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=None, help="base run config YAML")
    parser.add_argument("--checkpoint", default=None, help="encoder checkpoint (sts_matrix)")
    parser.add_argument("--reddit-checkpoint", default=None, help="Reddit-only checkpoint to warm-start from (train)")
    parser.add_argument("--prepared", default=None, help="prepared shards (train objective)")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        help="replace a space dimension: key=[v1,v2] (grid) or key=v (fixed); repeatable",
    )
    parser.add_argument("--num-samples", type=int, default=None)
    parser.add_argument("--max-concurrent", type=int, default=None, help="at most this many trials at once")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming DIR's sweep")
    parser.add_argument(
        "--max-failures",
        type=int,
        default=SweepRequest.max_failures,
        help="retries of a failed trial (a lost node, an error) from its own last checkpoint (default %(default)s)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the base config")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_with_overrides(parser, argv)  # overrides anywhere on the line (after --resume latest too)
    if args.max_failures < 0:
        parser.error(f"--max-failures: must be >= 0, got {args.max_failures}")
    setup_logging()
    try:
        space = get_space(args.space)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    cfg = load_config(args.config, args.overrides)
    from convsts.ray_jobs.sweeps.trials import grid_overrides
    from convsts.ray_jobs.sweeps.tuner import run_sweep

    try:
        inputs = sweep_inputs(space, args.checkpoint, args.reddit_checkpoint, args.prepared)
        results = run_sweep(
            SweepRequest(
                space,
                cfg,
                args.out,
                inputs,
                param_overrides=grid_overrides(args.param),
                num_samples=args.num_samples or 0,
                fresh=args.fresh,
                max_concurrent=args.max_concurrent,
                max_failures=args.max_failures,
            )
        )
    except SweepInterrupted as err:
        print(f"convsts tune: {err}")
        return 130
    except SweepTrialsFailed as err:
        print(f"convsts tune: {err}", file=sys.stderr)
        return 1
    print(redact(json.dumps(results, indent=2)))
    return 0
