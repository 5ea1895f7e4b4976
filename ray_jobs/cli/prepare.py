"""`convsts prepare`: raw task inputs -> parquet shards + manifest.json (Ray Data).

  convsts prepare reddit --input PATH [PATH ...] --out DIR [--format auto|pushshift|pairs]
  convsts prepare snli --input PATH --out DIR
  convsts prepare all --config configs/demo.yaml --out DIR     # every task the run config needs

`prepare TASK` works for every task in ray_jobs/tasks/ (and the config's task_modules).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from convsts.io.redaction import redact
from convsts.ray_jobs.config.loader import load_config, parse_with_overrides
from convsts.ray_jobs.pipelines.inputs import prepare_all
from convsts.ray_jobs.runtime.logs import setup_logging
from convsts.ray_jobs.tasks import builtin_tasks, get_task
from convsts.ray_jobs.tasks.prepared_folder import prepare_into


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", help=f"a task ({', '.join(builtin_tasks())}, or one from task_modules) or 'all'")
    parser.add_argument("--input", nargs="+", help="input files, folders or globs (one task)")
    parser.add_argument("--format", default=None, choices=["auto", "pushshift", "pairs"], help="Reddit input format")
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=None, help="run config YAML (filters, split, shard size)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.test_share=0.1")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_with_overrides(build_parser(), argv, ("input",))  # overrides may follow the options, --input A B too
    setup_logging()
    cfg = load_config(
        args.config, list(args.overrides) + ([f"data.reddit_format={args.format}"] if args.format else [])
    )
    if args.what == "all":
        result = prepare_all(cfg, args.out)
    else:
        try:
            task = get_task(args.what, cfg.task_modules)
        except ValueError as err:
            print(f"convsts prepare: {err}", file=sys.stderr)
            return 2
        result = prepare_into(task, args.input or task.raw_inputs(cfg), args.out, cfg)
    print(redact(json.dumps(result, indent=2)))
    return 0
