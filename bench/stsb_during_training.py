"""STS-B dev Pearson of the shared encoder while it trains, in one process (no Ray): the probe
behind the residual response head and `trainer.dense_lr_scale` (docs/design.md).

  .venv/bin/python bench/stsb_during_training.py --prepared DIR/prepared --tokenizer CKPT/tokenizer.json \\
      --weights reddit=0.95,snli=0.05 --steps 1250 [dotted.overrides ...]

Each step sums the tasks' weighted losses on one batch each (batch 128 from the prepared train
shards, shuffled with seed 0), with the optimizer and learning rates of the run config
(`--config`, overrides such as trainer.dense_lr_scale=0.1 or trainer.stages=[...]); every
`--every` steps it prints STS-B dev Pearson of the encoder and the mean step time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepared", required=True)
    parser.add_argument("--tokenizer", required=True, help="a tokenizer.json (e.g. from a checkpoint of the same data)")
    parser.add_argument("--config", default="configs/dan_multitask.yaml")
    parser.add_argument("--weights", default="reddit=0.95,snli=0.05")
    parser.add_argument("--steps", type=int, default=1250)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import torch
    from testkit.frames import FrameStream

    from convsts.datasets.text import load_tokenizer
    from convsts.models.checkpoint import build_model
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.evaluation.sts import StsDevProbe
    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.training.task_groups import GradientCombiner, draw_task, plan_tasks
    from convsts.ray_jobs.training.train_step import Optimizers, seed_everything, train_step

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    weights = {task: float(w) for task, w in (item.split("=") for item in args.weights.split(","))}
    tokenizer = load_tokenizer(args.tokenizer)
    probe = StsDevProbe(cfg, tokenizer)
    batch_size = cfg.trainer.stages[0].batch_size
    tasks = {name: get_task(name) for name in weights}
    streams = {
        name: FrameStream(
            task,
            pq.read_table(str(Path(args.prepared) / name / "train")).to_pandas(),
            tokenizer,
            batch_size,
            cfg.tokenizer.max_words,
            seed=cfg.seed,
            cfg=cfg,
        )
        for name, task in tasks.items()
    }
    seed_everything(cfg.seed)
    model = build_model(cfg.model, tokenizer)
    # The trainer's step, one process: each step's task drawn by weight (the 1-worker trainer's mode).
    plan = plan_tasks(weights, 1)
    combiner, draws = GradientCombiner(plan, 0), torch.Generator().manual_seed(cfg.seed)
    opts = Optimizers.build(cfg.trainer, model, list(weights), cfg.trainer.stages[0].lr)
    metric = StsDevProbe.METRIC
    print(f"{weights} step 0 {metric} {probe.evaluate(model)[metric]:.4f}", flush=True)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        name = draw_task(plan, draws)
        train_step(
            model, tasks[name], next(streams[name]), opts, combiner, cfg.trainer.grad_clip, cfg.trainer.precision
        )
        if step % args.every == 0:
            print(
                f"{weights} step {step} {metric} {probe.evaluate(model)[metric]:.4f} "
                f"{(time.perf_counter() - started) / step:.3f} s/step",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
