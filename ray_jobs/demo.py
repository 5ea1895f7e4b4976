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
import dataclasses
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from convsts.datasets.storage import BadInputError, redact, redact_tree
from convsts.datasets.text import load_tokenizer
from convsts.models.checkpoint import save_checkpoint
from convsts.models.encoders import DanEncoder, PretrainedEncoder
from convsts.ray_jobs import tracking
from convsts.ray_jobs.config import RunConfig, flatten, load_config
from convsts.ray_jobs.evaluation.compare import ITEMS_DIR, compare_evaluations
from convsts.ray_jobs.evaluation.harness import PRIMARY_METRIC, results_table, run_evaluation
from convsts.ray_jobs.evaluation.scorers import LexicalScorer
from convsts.ray_jobs.runtime import ensure_ray, log, setup_logging, tracking_uri
from convsts.ray_jobs.tasks import prepared_tasks
from convsts.ray_jobs.training.run import claim_output, prepare_all, run_outputs, run_training
from convsts.ray_jobs.training.state import initial_model

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DEMO_CONFIGS = {
    PretrainedEncoder.name: CONFIGS / "demo.yaml",
    DanEncoder.name: CONFIGS / "demo_dan.yaml",
}  # --encoder: its config
DEFAULT_ENCODER = PretrainedEncoder.name


def run_demo(
    cfg: RunConfig, out_dir: str | Path, baselines: Sequence[str] = LexicalScorer.KINDS, fresh: bool = False
) -> dict[str, object]:
    """Prepare, train, evaluate and compare into out_dir. An out_dir that holds an earlier demo is
    refused before any work, unless `fresh`: its training run's outputs are then removed (its
    MLflow store and runs are kept, and its prepared sample is kept when it verifies)."""
    started = time.time()
    out_dir = Path(out_dir).resolve()
    earlier = run_outputs(out_dir, cfg)
    if earlier and not fresh:
        raise FileExistsError(
            f"{out_dir} already holds a demo run ({', '.join(p.name for p in earlier)}): pass "
            f"--fresh to replace it (its MLflow runs are kept), or another --out"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri(cfg.mlflow.tracking_uri, out_dir)
    claim_output(out_dir, cfg, fresh)  # with --fresh: the earlier run's checkpoints go before this run starts
    ensure_ray()
    prepared = out_dir / "prepared"
    log.info("[1/4] preparing the embedded sample with Ray Data -> %s", prepared)
    try:
        manifests = prepare_all(cfg, str(prepared))
    except BadInputError as err:  # the earlier demo's sample, prepared with other data settings
        if not fresh:
            raise
        log.info("--fresh: %s; removed, prepared again", err)
        shutil.rmtree(prepared)
        manifests = prepare_all(cfg, str(prepared))
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
        "[2/4] training %s for %d steps with Ray Train (%d workers)",
        cfg.model.encoder,
        cfg.trainer.steps,
        cfg.trainer.num_workers,
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
        trained_name = f"{cfg.model.encoder}, {cfg.trainer.steps} steps"
        columns = {trained_name: {k: v for k, v in results.items() if isinstance(v, float)}}
        log.info("[4/4] the same encoder untrained (trainer.steps=0) and the baselines: %s", ", ".join(baselines))
        untrained = save_untrained(cfg, trained.checkpoint, out_dir / "untrained")
        others = {
            UNTRAINED: run_evaluation(
                cfg, out_dir / "eval_untrained", checkpoint=str(untrained), prepared_dir=prepared, log_to_mlflow=False
            )
        }
        for name in baselines:
            others[name] = run_evaluation(
                cfg, out_dir / f"baseline_{name}", baseline=name, prepared_dir=prepared, log_to_mlflow=False
            )
        # The gain over the untrained encoder on the same queries, with its paired standard error.
        evaluations = (out_dir / "eval", out_dir / "eval_untrained")
        paired = (
            compare_evaluations(*evaluations, suffix=f"minus_{UNTRAINED}")
            if all((e / ITEMS_DIR).is_dir() for e in evaluations)
            else {}
        )  # none without a Reddit held-out split
        columns[trained_name].update(paired)
        flat: dict[str, object] = dict(columns[trained_name])
        for name, metrics in others.items():
            columns[name] = {k: v for k, v in metrics.items() if isinstance(v, float)}
            prefix = f"{UNTRAINED}/" if name == UNTRAINED else f"baseline/{name}/"
            flat.update({prefix + k: v for k, v in columns[name].items()})
        compared = {k: v for k, v in flat.items() if k.startswith((f"{UNTRAINED}/", "baseline/"))}
        tracking.log_metrics(
            uri, run_id, {**compared, **paired}, cfg.trainer.steps
        )  # beside the model's, at its last step
        flat["checkpoint"] = str(trained.checkpoint)
        flat["mlflow_run_id"] = run_id
        flat["seconds"] = round(time.time() - started, 1)
        table = results_table(columns)
        (out_dir / "results.json").write_text(redact(json.dumps(flat, indent=2)), encoding="utf-8")
        (out_dir / "results.md").write_text(table + "\n", encoding="utf-8")
        tracking.log_artifact(uri, run_id, str(out_dir / "results.json"))
        tracking.log_artifact(uri, run_id, str(out_dir / "results.md"))
        tracking.log_metrics(uri, run_id, {"demo/seconds": flat["seconds"]})
        tracking.end_run(uri, run_id)
    except BaseException:
        tracking.end_run(uri, run_id, "FAILED")
        raise
    print()
    print(table)
    print()
    print(f"primary metric {PRIMARY_METRIC}: {flat.get(PRIMARY_METRIC, float('nan')):.4f}")
    print(f"results:        {out_dir / 'results.json'}")
    print(f"checkpoint:     {trained.checkpoint}")
    print(f"MLflow run id:  {run_id}")
    print(f"MLflow UI:      {tracking.ui_command(uri)}")
    print(f"took {flat['seconds']:.0f} s")
    return flat


UNTRAINED = "untrained"  # results.json key prefix and table column of the encoder before training


def save_untrained(cfg: RunConfig, trained_checkpoint: str | Path, path: Path) -> Path:
    """The checkpoint `trainer.steps=0` would save, without a second Ray Train job: the run's own
    initial weights (seeded, or pretrained) with the trained checkpoint's tokenizer."""
    tokenizer = load_tokenizer(Path(trained_checkpoint) / "tokenizer.json")
    untrained = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, steps=0))
    return save_checkpoint(path, initial_model(cfg, tokenizer), tokenizer, redact_tree(untrained.to_dict()))


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
    args = build_parser().parse_args(argv)
    setup_logging()
    run_demo(load_config(args.config or DEMO_CONFIGS[args.encoder], args.overrides), args.out, fresh=args.fresh)
    return 0


if __name__ == "__main__":
    from convsts.ray_jobs.runtime import run_main

    raise SystemExit(run_main("demo", main))
