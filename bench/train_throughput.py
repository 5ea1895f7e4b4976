"""Training throughput: the Ray Train job against a plain single-process PyTorch loop on the same
model, config and prepared data; and 2 workers against 1.

  .venv/bin/python bench/train_throughput.py [--config configs/demo.yaml] [--prepared DIR] [--steps 300]

Prints steady-state pairs/s (median step time after warm-up; Ray's start-up is reported
separately) and the ratios. The plain loop tokenizes with the same tokenizer and draws each
step's task by weight, as the 1-worker Ray job does (task_sampling mode).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.checkpoint import build_model  # noqa: E402
from ray_jobs.config import load_config  # noqa: E402
from ray_jobs.task_groups import mark_sparse  # noqa: E402
from ray_jobs.train import build_tokenizer, frame_batch, make_optimizer, run_training, task_loss  # noqa: E402


def plain_loop(cfg, prepared: Path, tokenizer, steps: int, warmup: int) -> float:
    """pairs/s of one process: parquet -> tokenize -> forward/backward/step, nothing else."""
    import pyarrow.parquet as pq

    frames = {t: pq.read_table(str(prepared / t / "train")).to_pandas().sample(frac=1.0, random_state=0)
              for t in cfg.trainer.task_weights}
    torch.manual_seed(cfg.trainer.seed)
    model = build_model(cfg.model, tokenizer)
    mark_sparse([model.encoder.word_embedding.weight, model.encoder.bigram_embedding.weight])
    batch_size, lr = cfg.trainer.stages[0].batch_size, cfg.trainer.stages[0].lr
    opts = make_optimizer(cfg, list(model.parameters()), lr)
    tasks = list(cfg.trainer.task_weights)
    probs = np.array([cfg.trainer.task_weights[t] for t in tasks], dtype=float)
    rng = np.random.default_rng(cfg.trainer.seed)
    offsets = {t: 0 for t in tasks}
    times = []
    for step in range(steps):
        start = time.perf_counter()
        task = tasks[rng.choice(len(tasks), p=probs / probs.sum())]
        frame = frames[task]
        if offsets[task] + batch_size > len(frame):
            offsets[task] = 0
        part = frame.iloc[offsets[task]: offsets[task] + batch_size]
        offsets[task] += batch_size
        batch = frame_batch(tokenizer, part, task, cfg.tokenizer.max_words)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss, _ = task_loss(model, task, batch)
        loss.backward()
        for opt in opts:
            opt.step()
        times.append(time.perf_counter() - start)
    return batch_size / statistics.median(times[warmup:])


def ray_job(cfg, prepared: Path, workers: int, steps: int, out: Path) -> tuple[float, float]:
    """(steady-state pairs/s, seconds of the whole fit) of the Ray Train job with `workers` workers."""
    from mlflow.tracking import MlflowClient

    cfg.trainer.num_workers = workers
    cfg.trainer.steps = steps
    cfg.trainer.log_every = 10
    cfg.trainer.eval_every = 0
    cfg.trainer.checkpoint_every = steps
    started = time.time()
    result = run_training(cfg, out, prepared_dir=prepared)
    history = MlflowClient(result.tracking_uri).get_metric_history(result.run_id, "step_time_s")
    step_times = [m.value for m in sorted(history, key=lambda m: m.step)][2:]  # skip the warm-up windows
    pairs_per_step = cfg.trainer.stages[0].batch_size * workers  # every worker runs one batch a step
    return pairs_per_step / statistics.median(step_times), time.time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--prepared", default=None, help="prepared shards (default: prepare the config's data)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from ray_jobs.runtime import ensure_ray

    cfg = load_config(args.config, args.overrides)
    work = Path(tempfile.mkdtemp(prefix="convsts-bench-"))
    cfg.mlflow.tracking_uri = f"sqlite:///{work / 'mlflow.db'}"
    ensure_ray()
    prepared = Path(args.prepared) if args.prepared else work / "prepared"
    if not args.prepared:
        from ray_jobs.prepare import prepare_all

        prepare_all(cfg, prepared)
    tokenizer = build_tokenizer(cfg, prepared)
    torch.set_num_threads(max(1, int(cfg.trainer.cpus_per_worker)) if cfg.trainer.cpus_per_worker >= 1 else 1)

    plain = plain_loop(cfg, prepared, tokenizer, args.steps, args.warmup)
    torch.set_num_threads(os.cpu_count() or 1)
    one, one_s = ray_job(load_config(args.config, args.overrides + [f"mlflow.tracking_uri={cfg.mlflow.tracking_uri}"]),
                         prepared, 1, args.steps, work / "ray1")
    two, two_s = ray_job(load_config(args.config, args.overrides + [f"mlflow.tracking_uri={cfg.mlflow.tracking_uri}"]),
                         prepared, 2, args.steps, work / "ray2")
    print(f"config {args.config}, {args.steps} steps, batch {cfg.trainer.stages[0].batch_size}, "
          f"{os.cpu_count()} CPUs, torch threads in the plain loop: 1 (a Ray worker gets "
          f"{cfg.trainer.cpus_per_worker} CPU)")
    print(f"plain single-process loop   {plain:9.1f} pairs/s")
    print(f"Ray Train, 1 worker         {one:9.1f} pairs/s   (whole fit incl. start-up {one_s:.0f} s)")
    print(f"Ray Train, 2 workers        {two:9.1f} pairs/s   (whole fit incl. start-up {two_s:.0f} s)")
    print(f"ratio Ray 1 worker / plain  {one / plain:9.2f}")
    print(f"ratio 2 workers / 1 worker  {two / one:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
