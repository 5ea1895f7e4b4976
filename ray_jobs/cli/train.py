"""`convsts train`: multitask training on Ray Train (TorchTrainer, Train V2).

  convsts train --config configs/dan_multitask.yaml --out DIR [dotted.overrides=...]

Data flows one way: prepared parquet shards -> each task's Ray Data pipeline (each block read once,
in the epoch's order, tokenized in map_batches) -> the task's dealer, which hands each rank its
slice of every global batch (trainer.feed=local: each worker reads its own slices) -> shared
encoder + heads -> losses -> combined gradients -> checkpoints and MLflow (docs/design.md has the
module map). The final checkpoint is copied to DIR/checkpoint.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from convsts.io import storage
from convsts.io.redaction import redact
from convsts.ray_jobs.config.loader import is_override, load_config, parse_with_overrides
from convsts.ray_jobs.config.schema import RESUME_LATEST
from convsts.ray_jobs.pipelines.inputs import ensure_prepared
from convsts.ray_jobs.runtime.logs import log, setup_logging
from convsts.ray_jobs.runtime.output_lock import output_lock
from convsts.ray_jobs.runtime.tracking_store import tracking_uri
from convsts.ray_jobs.training.lineage import AlreadyFinished
from convsts.ray_jobs.training.start_checks import prepared_location

# A stopped run is continued from its newest complete checkpoint, not started again.
GO_ON = f"add --resume {RESUME_LATEST} to the same command to go on from its newest complete checkpoint"


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=None, help="run config YAML")
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (checkpoint, model, ray_results, mlflow.db); required unless --print-config",
    )
    parser.add_argument("--prepared", default=None, help="prepared shards (default: data.prepared_dir or OUT/prepared)")
    parser.add_argument(
        "--resume",
        nargs="?",
        const=RESUME_LATEST,
        default=None,
        metavar="CHECKPOINT",
        help=f"checkpoint folder to resume from (checked: complete, same model, tokenizer settings, tasks and "
        f"prepared data); alone or '{RESUME_LATEST}': the newest complete checkpoint of the run OUT records "
        "(a run whose driver died)",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="OUT already holds a run: delete its checkpoints and start over"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved run config (YAML, credentials masked) and exit"
    )
    parser.add_argument(
        "--register-as",
        default=None,
        metavar="NAME",
        help="register the run's MLflow model under NAME (mlflow.register_as)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.steps=500")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_with_overrides(build_parser(), argv)  # overrides anywhere on the line (after --resume latest too)
    if args.resume and is_override(args.resume):  # `--resume trainer.steps=9`: --resume alone, then overrides
        args.overrides, args.resume = [args.resume, *args.overrides], RESUME_LATEST
    setup_logging()
    overrides = list(args.overrides) + ([f"trainer.resume_from={args.resume}"] if args.resume else [])
    overrides += [f"mlflow.register_as={args.register_as}"] if args.register_as else []
    cfg = load_config(args.config, overrides)
    if args.print_config:
        print(redact(cfg.to_yaml()), end="")
        return 0
    if not args.out:
        build_parser().error("the following arguments are required: --out")
    storage.check_bucket(cfg.trainer.storage_path, "trainer.storage_path")  # before the data is prepared
    with output_lock(args.out, "train"):  # before anything is written there: the store, the prepared data
        # A tracking server that is not there fails before prepare, and before the library loads.
        uri = tracking_uri(cfg.mlflow.tracking_uri, args.out)
        from convsts.ray_jobs.training.driver import run_training

        prepared = prepared_location(cfg, args.out, args.prepared)
        try:
            result = run_training(
                cfg, args.out, prepared_dir=prepared, fresh=args.fresh, mlflow_uri=uri, prepare_missing=ensure_prepared
            )
        except AlreadyFinished as finished:  # --resume latest with nothing left to train: said, exit 0
            log.info("%s", finished)
            return 0
    summary = {
        "checkpoint": str(result.checkpoint),
        "model": str(result.model),
        "mlflow_run_id": result.run_id,
        "seconds": round(result.seconds, 1),
        "task_split_mode": result.mode,
    }
    print(json.dumps(summary, indent=2))
    return 0
