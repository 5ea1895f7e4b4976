"""Training throughput: the Ray Train job against a plain single-process PyTorch loop on the same
model, config and prepared data; larger groups (--workers) against 1 worker; and with --feeds, each
feed (trainer.feed: ray_data, local) at each group size.

  .venv/bin/python bench/train_throughput.py [--config configs/demo_dan.yaml] [--prepared DIR] [--steps 300]
      [--workers 1,2] [--feeds ray_data local]

Prints steady-state pairs/s (median step time after warm-up; Ray's start-up is reported
separately, as the whole fit's seconds) and the ratios: the first feed's against each other's at
each size. The plain loop tokenizes with the same tokenizer and draws each
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

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from testkit.frames import FrameStream  # noqa: E402  (the feed over a frame, without Ray)

from convsts.models.checkpoint import build_model  # noqa: E402
from convsts.ray_jobs.config.loader import load_config  # noqa: E402
from convsts.ray_jobs.pipelines.inputs import prepare_all  # noqa: E402
from convsts.ray_jobs.tasks import model_heads, trained_tasks  # noqa: E402
from convsts.ray_jobs.training.driver import run_training  # noqa: E402
from convsts.ray_jobs.training.task_groups import GradientCombiner, draw_task, plan_tasks  # noqa: E402
from convsts.ray_jobs.training.tokenizer_fit import build_tokenizer  # noqa: E402
from convsts.ray_jobs.training.train_step import Optimizers, seed_everything, train_step  # noqa: E402


def plain_loop(cfg, prepared: Path, tokenizer, steps: int, warmup: int) -> float:
    """pairs/s of one process: parquet -> tokenize -> forward/backward/step, nothing else (on the GPU
    when the config has trainer.use_gpu and one is there)."""
    import pyarrow.parquet as pq

    tasks = trained_tasks(cfg)
    batch_size, lr = cfg.trainer.stages[0].batch_size, cfg.trainer.stages[0].lr
    streams = {
        name: FrameStream(
            task,
            pq.read_table(str(prepared / name / "train")).to_pandas(),
            tokenizer,
            batch_size,
            cfg.tokenizer.max_words,
            seed=cfg.seed,
            cfg=cfg,
        )
        for name, task in tasks.items()
    }
    seed_everything(cfg.seed)
    device = torch.device("cuda" if cfg.trainer.use_gpu and torch.cuda.is_available() else "cpu")
    model = build_model(cfg.model, tokenizer, model_heads(cfg)).to(device)
    plan = plan_tasks(cfg.trainer.task_weights, 1)
    combiner, draws = GradientCombiner(plan, 0), torch.Generator().manual_seed(cfg.seed)
    opts = Optimizers.build(cfg.trainer, model, list(tasks), lr)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        name = draw_task(plan, draws)
        batch = {key: value.to(device) for key, value in next(streams[name]).items()}  # tokenizes too
        train_step(model, tasks[name], batch, opts, combiner, cfg.trainer.grad_clip, cfg.trainer.precision)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return batch_size / statistics.median(times[warmup:])


def ray_job(cfg, prepared: Path, workers: int, steps: int, out: Path, feed: str) -> tuple[float, float]:
    """(steady-state pairs/s, seconds of the whole fit) of the Ray Train job with `workers` workers
    reading with `feed`."""
    from mlflow.tracking import MlflowClient

    cfg.trainer.feed = feed
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
    parser.add_argument("--config", default="configs/demo_dan.yaml")
    parser.add_argument("--prepared", default=None, help="prepared shards (default: prepare the config's data)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2],
        help="Ray Train group sizes to time, comma-separated (default 1,2; 1 on a one-GPU node)",
    )
    parser.add_argument(
        "--feeds", nargs="+", default=["ray_data"], help="trainer.feed values to time at each size (ray_data, local)"
    )
    parser.add_argument("--no-plain", action="store_true", help="skip the plain single-process loop")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from convsts.ray_jobs.runtime.ray_start import ensure_ray

    cfg = load_config(args.config, args.overrides)
    work = Path(tempfile.mkdtemp(prefix="convsts-bench-"))
    cfg.mlflow.tracking_uri = f"sqlite:///{work / 'mlflow.db'}"
    ensure_ray()
    prepared = Path(args.prepared) if args.prepared else work / "prepared"
    if not args.prepared:
        prepare_all(cfg, str(prepared))
    tokenizer = build_tokenizer(cfg, prepared)
    torch.set_num_threads(max(1, int(cfg.trainer.cpus_per_worker)) if cfg.trainer.cpus_per_worker >= 1 else 1)

    plain = None if args.no_plain else plain_loop(cfg, prepared, tokenizer, args.steps, args.warmup)
    print(
        f"config {args.config}, {args.steps} steps, batch {cfg.trainer.stages[0].batch_size}, "
        f"{os.cpu_count()} CPUs, torch threads in the plain loop: 1 (a Ray worker gets "
        f"{cfg.trainer.cpus_per_worker} CPU)"
    )
    if plain is not None:
        print(f"plain single-process loop   {plain:9.1f} pairs/s", flush=True)
    torch.set_num_threads(os.cpu_count() or 1)
    rates = {}
    for workers in args.workers:
        for feed in args.feeds:
            rates[workers, feed], fit_s = ray_job(
                load_config(args.config, args.overrides + [f"mlflow.tracking_uri={cfg.mlflow.tracking_uri}"]),
                prepared,
                workers,
                args.steps,
                work / f"ray{workers}-{feed}",
                feed,
            )
            print(
                f"Ray Train, {workers} worker(s), feed {feed:8s} {rates[workers, feed]:9.1f} pairs/s   "
                f"(whole fit incl. start-up {fit_s:.0f} s)",
                flush=True,
            )
    first, feed = args.workers[0], args.feeds[0]
    if plain is not None:
        print(f"ratio Ray {first} worker(s) / plain  {rates[first, feed] / plain:9.2f}")
    for workers in args.workers[1:]:
        print(f"ratio {workers} workers / {first} worker(s)  {rates[workers, feed] / rates[first, feed]:9.2f}")
    for workers in args.workers:
        for other in args.feeds[1:]:
            print(f"ratio {feed} / {other} at {workers} worker(s)  {rates[workers, feed] / rates[workers, other]:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
