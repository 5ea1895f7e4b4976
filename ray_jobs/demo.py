"""`convsts demo --out DIR`: the whole pipeline on the embedded sample, on a local Ray instance.

prepare (Ray Data) -> multitask DAN training (Ray Train, one worker per task) -> checkpoint ->
evaluation (STS-B dev/test, Reddit P@N, SNLI dev, CQA MAP; bag-of-words and TF-IDF baselines) ->
one MLflow run (sqlite store in DIR) -> DIR/results.json and a results table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Dict, Sequence

from datasets.storage import redact
from ray_jobs import tracking
from ray_jobs.config import RunConfig, flatten, load_config
from ray_jobs.evaluation.harness import PRIMARY_METRIC, results_table, run_evaluation
from ray_jobs.evaluation.scorers import LexicalScorer
from ray_jobs.runtime import ensure_ray, log, setup_logging, tracking_uri
from ray_jobs.tasks import prepared_tasks
from ray_jobs.training.run import prepare_all, run_training

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


def run_demo(cfg: RunConfig, out_dir: str | Path, baselines: Sequence[str] = LexicalScorer.KINDS) -> Dict[str, object]:
    started = time.time()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ensure_ray()
    prepared = out_dir / "prepared"
    log.info("[1/4] preparing the embedded sample with Ray Data -> %s", prepared)
    manifests = prepare_all(cfg, str(prepared))
    uri = tracking_uri(cfg.mlflow.tracking_uri, out_dir)
    run_id = tracking.start_run(uri, cfg.mlflow.experiment, cfg.mlflow.run_name or cfg.name,
                                flatten(cfg.to_dict()), tags={"convsts.job": "demo"})
    tasks = prepared_tasks(cfg)
    for name, manifest in manifests.items():
        tracking.log_metrics(uri, run_id, tasks[name].manifest_metrics(manifest))
    log.info("[2/4] training %s for %d steps with Ray Train (%d workers)", cfg.model.encoder, cfg.trainer.steps,
             cfg.trainer.num_workers)
    try:
        trained = run_training(cfg, out_dir, run_id=run_id, prepared_dir=prepared)
        log.info("[3/4] evaluating %s", trained.checkpoint)
        results = run_evaluation(cfg, out_dir / "eval", checkpoint=str(trained.checkpoint), prepared_dir=prepared,
                                 run_id=run_id, mlflow_uri=uri)
        columns = {"model": {k: v for k, v in results.items() if isinstance(v, float)}}
        log.info("[4/4] baselines: %s", ", ".join(baselines))
        for name in baselines:
            base = run_evaluation(cfg, out_dir / f"baseline_{name}", baseline=name, prepared_dir=prepared,
                                  log_to_mlflow=False)
            columns[name] = {k: v for k, v in base.items() if isinstance(v, float)}
        flat: Dict[str, object] = dict(columns["model"])
        for name in baselines:
            flat.update({f"baseline/{name}/{k}": v for k, v in columns[name].items()})
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


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="convsts demo", description=__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.steps=50")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    run_demo(load_config(args.config, args.overrides), args.out)
    return 0


if __name__ == "__main__":
    from ray_jobs.runtime import run_main

    raise SystemExit(run_main("demo", main))
