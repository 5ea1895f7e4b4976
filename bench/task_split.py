"""Synchronous vs asynchronous task groups (trainer.task_split) on the same data and wall-time budget,
through `run_training` (Ray Train, the parameter holder) and `run_evaluation`, as a user runs them.

  .venv/bin/python bench/task_split.py --prepared /path/prepared --minutes 7.5 --out /tmp/split [dotted.overrides ...]

For each mode: a short calibration run measures the seconds per update (rank 0's step_time_s after
its first window) and the run's fixed cost (start-up, the final checkpoint and model), then a run
of as many updates as fit in --minutes of training (what run_training reports as its seconds),
then the full evaluation of its last checkpoint. Prints one row per mode: updates, training seconds, pairs/s per task, the
realised Reddit:SNLI update ratio, staleness (updates applied between a worker's copy and its
push), STS-B dev/test Pearson, Reddit P@1 and SNLI dev accuracy, with the MLflow run ids.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _history(client, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/dan_multitask.yaml")
    parser.add_argument("--prepared", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--calibration-steps", type=int, default=300)
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from convsts.models.checkpoint import Checkpoint
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.pipelines.evaluate import run_evaluation
    from convsts.ray_jobs.runtime.ray_start import ensure_ray
    from convsts.ray_jobs.tracking import runs as tracking
    from convsts.ray_jobs.training.driver import run_training

    ensure_ray()
    out = Path(args.out)
    rows: dict[str, dict[str, float]] = {}
    # One stage (the budget's step counts differ by mode) and no checkpoints but the last.
    common = [
        "trainer.stages=[{start_step: 0, batch_size: 128, lr: 0.001}]",
        "trainer.eval_every=0",
        "trainer.log_every=25",
    ]
    for mode in args.modes.split(","):

        def config(steps: int, name: str, mode: str = mode):
            return load_config(
                args.config,
                [
                    *common,
                    f"trainer.task_split={mode}",
                    f"trainer.steps={steps}",
                    f"trainer.checkpoint_every={steps}",
                    f"name={name}",
                    *args.overrides,
                ],
            )

        calib = run_training(
            config(args.calibration_steps, f"split-{mode}-calibration"),
            out / f"{mode}-calibration",
            prepared_dir=args.prepared,
            fresh=True,
        )
        client = tracking.client(calib.tracking_uri)
        step_s = statistics.median(_history(client, calib.run_id, "step_time_s")[1:])
        fixed_s = max(calib.seconds - args.calibration_steps * step_s, 0.0)
        steps = int((args.minutes * 60 - fixed_s) / step_s)
        print(
            f"[bench] {mode}: {step_s * 1000:.1f} ms per update, {fixed_s:.0f} s fixed -> {steps} updates in "
            f"{args.minutes} min",
            flush=True,
        )
        cfg = config(steps, f"split-{mode}")
        result = run_training(cfg, out / mode, prepared_dir=args.prepared, fresh=True)
        client = tracking.client(result.tracking_uri)
        state = Checkpoint.at(result.checkpoint).train_state()
        row: dict[str, float] = {"updates": steps, "seconds": result.seconds}
        if mode == "async":
            updates = state.task_updates
            row["ratio"] = updates["reddit"] / max(updates["snli"], 1)
            for task in ("reddit", "snli"):
                row[f"{task}_pairs_s"] = _mean(_history(client, result.run_id, f"async/{task}/pairs_per_s")[1:])
            row["staleness_reddit"] = _mean(_history(client, result.run_id, "async/reddit/staleness_mean"))
            row["staleness_snli"] = _mean(_history(client, result.run_id, "async/snli/staleness_mean"))
        else:  # every update mixes one batch of each task, weighted 0.95 / 0.05
            row["ratio"] = 1.0
            for task in ("reddit", "snli"):
                row[f"{task}_pairs_s"] = _mean(_history(client, result.run_id, f"{task}/pairs_per_s")[1:])
            row["staleness_reddit"] = row["staleness_snli"] = 0.0
        results = run_evaluation(
            cfg,
            out / f"{mode}-eval",
            checkpoint=str(result.checkpoint),
            prepared_dir=args.prepared,
            run_id=result.run_id,
            mlflow_uri=result.tracking_uri,
        )
        row.update(
            {
                "stsb_dev": results["stsb/dev/pearson"],
                "stsb_test": results["stsb/test/pearson"],
                "p_at_1": results["reddit/p_at_1"],
                "snli_dev": results["snli/dev/accuracy"],
                "run": result.run_id,
            }
        )
        rows[mode] = row
        print(f"[bench] {mode}: {row}", flush=True)

    print(
        "| mode | updates | train s | Reddit pairs/s | SNLI pairs/s | Reddit:SNLI updates | staleness Reddit / SNLI "
        "| STS-B dev | STS-B test | P@1 | SNLI dev | MLflow run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, r in rows.items():
        print(
            f"| {mode} | {r['updates']:.0f} | {r['seconds']:.0f} | {r['reddit_pairs_s']:.0f} | {r['snli_pairs_s']:.0f} "
            f"| {r['ratio']:.1f}:1 | {r['staleness_reddit']:.2f} / {r['staleness_snli']:.2f} | {r['stsb_dev']:.4f} "
            f"| {r['stsb_test']:.4f} | {r['p_at_1']:.4f} | {r['snli_dev']:.4f} | {r['run']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
