"""How long a restart takes to reach its first step, early and late in an epoch of the full prepared
Reddit data: a `convsts train` (one worker, the tiny DAN, Reddit only) stopped at a checkpoint at
each position, then the same command with `--resume latest`, timed from its launch to its first
step's end (the MLflow timestamp of that step's loss, logged every step), beside a fresh run's
launch to its first step. What a restart costs beyond the driver, the worker group and the model is
reaching its data position: a feed that seeks costs the same at every position, one that reads
through to it costs in proportion to how far the epoch has gone.

  .venv/bin/python bench/restart_first_step.py [--input ../shared/data/reddit] [--at 0.05 0.95]
      [--feeds ray_data local]  # trainer.feed: each timed at every position
      [--source DIR]  # time another checkout of convsts (its folder; e.g. `git worktree add`)

Every command joins one local Ray instance the bench starts (RAY_ADDRESS), so no restart pays for a
Ray start. Prints, for each feed, a fresh run's seconds to its first step, then one row per position:
the step, the restart's seconds to its first step, and how much longer than at the first position.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = [
    "tokenizer.word_vocab_size=20000",
    "tokenizer.bigram_buckets=20000",
    "model.dan.embedding_dim=64",
    "model.dan.hidden_sizes=[64]",
    "model.dan.output_dim=64",
    "model.response_hidden=64",
    "trainer.num_workers=1",
    "trainer.task_weights={reddit: 1.0}",
    "trainer.eval_every=0",
]


def _first_step_seconds(out: Path, step: int, launched: float) -> float:
    """Seconds from `launched` to the end of `step` (its loss's MLflow timestamp) of OUT's newest run."""
    from mlflow.tracking import MlflowClient

    run_id = json.loads((out / "run.json").read_text())["runs"][-1]["run_id"]
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    points = {m.step: m.timestamp for m in client.get_metric_history(run_id, "reddit/loss")}
    return points[step] / 1000 - launched


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", default=str(REPO.parent / "shared/data/reddit"))
    parser.add_argument("--at", type=float, nargs="+", default=[0.05, 0.95], help="positions, as shares of an epoch")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--source", default=str(REPO), help="the convsts checkout whose commands are timed")
    parser.add_argument("--feeds", nargs="+", default=[None], help="trainer.feed values (default: the config's)")
    args = parser.parse_args()

    import ray

    work = Path(tempfile.mkdtemp(prefix="convsts-bench-restart-"))
    os.environ["PYTHONPATH"] = args.source  # the instance's workers import the timed checkout too
    ray.init(num_cpus=2, include_dashboard=True, logging_level="ERROR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_"))}
    env.update(RAY_ADDRESS=ray.get_runtime_context().gcs_address, PYTHONPATH=args.source, RAY_USAGE_STATS_ENABLED="0")
    cli = [sys.executable, "-m", "convsts"]

    def convsts(*argv: str) -> float:
        """Run `convsts ARGV` from the timed checkout; its launch time."""
        launched = time.time()
        done = subprocess.run([*cli, *argv], cwd=args.source, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"convsts {' '.join(argv[:3])} failed:\n{done.stderr[-3000:]}")
        return launched

    prepared, inputs = work / "prepared", f"data.reddit_inputs=[{args.input}]"
    convsts("prepare", "reddit", "--out", str(prepared / "reddit"), inputs)
    manifest = json.loads((prepared / "reddit" / "manifest.json").read_text())
    rows = sum(int(s["rows"]) for s in manifest["shards"]["train"])
    epoch_steps = rows // args.batch
    stage = f"trainer.stages=[{{start_step: 0, batch_size: {args.batch}, lr: 0.001}}]"
    print(f"{rows:,} Reddit training pairs: {epoch_steps} steps of {args.batch} an epoch; timed: {args.source}")

    def train(out: Path, steps: int, *extra: str) -> float:
        return convsts("train", "--out", str(out), "--prepared", str(prepared), *extra, *TINY, stage, inputs,
                       f"trainer.steps={steps}", "trainer.log_every=1")  # fmt: skip

    for feed in args.feeds:
        chosen = (f"trainer.feed={feed}",) if feed else ()
        fresh = work / f"fresh-{feed}"
        fresh_s = _first_step_seconds(fresh, 1, train(fresh, 2, "trainer.checkpoint_every=2", *chosen))
        print(
            f"\nfeed {feed or 'as configured'}: a fresh run: {fresh_s:.1f} s to its first step (its tokenizer fitted)"
        )
        print("| feed | position in the epoch | step | restart: first step | beside the first position's |")
        print("|---|---|---|---|---|")
        first_s = None
        for share in args.at:
            at = max(1, int(epoch_steps * share))
            out = work / f"at{at}-{feed}"
            train(out, at, f"trainer.checkpoint_every={at}", *chosen)
            resumed = train(out, at + 2, "--resume", "latest", f"trainer.checkpoint_every={at}", *chosen)
            restart_s = _first_step_seconds(out, at + 1, resumed)
            first_s = restart_s if first_s is None else first_s
            print(f"| {feed} | {share:.0%} | {at} | {restart_s:.1f} s | {restart_s - first_s:+.1f} s |", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
