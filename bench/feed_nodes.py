"""Where the feed tokenizes: a fit of one worker on a cluster on this host whose training node has one
CPU, beside a node of --feed-cpus CPUs that holds no worker, with each feed (trainer.feed: ray_data,
local). A head of no CPUs (it schedules, and holds the driver's actors: the tasks' dealers), the
training node started with a custom resource the worker asks for (trainer.worker_resources=
{trainer_node: 1}), and the feed node with CPUs only, each its own raylet as the cluster tests start
them. Each node's Ray processes (and the workers and tasks they start) run on cores of their own
(sched_setaffinity): the training node on core 0, the head, the driver and the feed node on the
rest, so the 1-CPU node computes on one core.

  .venv/bin/python bench/feed_nodes.py [--config configs/demo_dan.yaml] [--prepared DIR] [--steps 300] [--feed-cpus 2]
      [overrides ...]  # dotted overrides for both fits, e.g. a smaller model

With `local` the worker reads and tokenizes its batches on its own core beside its steps; with
`ray_data` its task's pipeline tokenizes on the feed node. Prints each feed's steady-state pairs/s
(batch / median step time after the first two logging windows) and whole fit, and ray_data / local.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from testkit.local_cluster import pids_matching, ray_head, ray_worker_node  # noqa: E402

RESOURCE = "trainer_node"
LOG = 10


def pin(node: dict[str, str], cores: set[int]) -> None:
    """Every thread of the node's processes on `cores`; the workers and tasks its raylet starts
    later inherit them."""
    for pid in pids_matching(node["temp_dir"]):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), cores)


def fit(
    config: str,
    overrides: list[str],
    prepared: Path,
    out: Path,
    feed: str,
    steps: int,
    env: dict[str, str],
    cores: set[int],
) -> tuple[float, float]:
    """(steady-state pairs/s, whole fit's seconds) of `convsts train` with `feed` on the cluster, its
    driver on `cores`."""
    from mlflow.tracking import MlflowClient

    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.runtime.run_folder import RunFolder

    uri = f"sqlite:///{out.parent / 'mlflow.db'}"
    command = [sys.executable, "-m", "convsts", "train", "--config", config, "--out", str(out), "--prepared", str(prepared),
               f"trainer.feed={feed}", "trainer.num_workers=1", "trainer.cpus_per_worker=1", "trainer.torch_threads=1",
               f"trainer.worker_resources={{{RESOURCE}: 1}}", f"trainer.steps={steps}", f"trainer.log_every={LOG}",
               "trainer.eval_every=0", f"trainer.checkpoint_every={steps}", f"mlflow.tracking_uri={uri}", *overrides]  # fmt: skip
    started = time.time()
    with open(out.parent / f"{feed}.log", "w") as log:
        done = subprocess.run(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=False,
            preexec_fn=lambda: os.sched_setaffinity(0, cores),
        )  # fmt: skip
    whole = time.time() - started
    if done.returncode != 0:
        raise SystemExit(f"convsts train with trainer.feed={feed} failed: see {out.parent / f'{feed}.log'}")
    run_id = json.loads(RunFolder(out).run_record.read_text())["runs"][-1]["run_id"]
    history = sorted(MlflowClient(uri).get_metric_history(run_id, "step_time_s"), key=lambda m: m.step)
    batch = load_config(config, overrides).trainer.stages[0].batch_size
    return batch / statistics.median(m.value for m in history[2:]), whole


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo_dan.yaml")
    parser.add_argument("--prepared", default=None, help="prepared shards (default: prepare the config's data)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--feed-cpus", type=int, default=2, help="CPUs of the node that holds no worker")
    parser.add_argument("--feeds", nargs="+", default=["ray_data", "local"])
    parser.add_argument("overrides", nargs="*", help="dotted overrides for both fits")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores or more: one for the training node, the rest for the feed node")
    work = Path(tempfile.mkdtemp(prefix="bench-feed-nodes-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_"))}
    base.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    prepared = Path(args.prepared) if args.prepared else work / "prepared"
    if not args.prepared:
        subprocess.run([sys.executable, "-m", "convsts", "prepare", "all", "--config", args.config, "--out", str(prepared)],
                       cwd=REPO, env=base, check=True)  # fmt: skip
    rates: dict[str, tuple[float, float]] = {}
    with contextlib.ExitStack() as stack:
        rest = set(cores[1:])
        head = stack.enter_context(ray_head(base, num_cpus=0))
        pin(head, rest)
        training = ray_worker_node(
            head["gcs"], base, num_cpus=1, ip="127.0.0.2", options=[f'--resources={{"{RESOURCE}": 1}}']
        )
        pin(stack.enter_context(training), {cores[0]})
        pin(stack.enter_context(ray_worker_node(head["gcs"], base, num_cpus=args.feed_cpus, ip="127.0.0.3")), rest)
        driver = {**base, "RAY_ADDRESS": head["gcs"]}
        for feed in args.feeds:
            rates[feed] = fit(
                args.config, args.overrides, prepared, work / f"run-{feed}", feed, args.steps, driver, rest
            )
            print(
                f"feed {feed:8s} {rates[feed][0]:9.1f} pairs/s   (whole fit incl. start-up {rates[feed][1]:.0f} s)",
                flush=True,
            )
    print(f"config {args.config} {' '.join(args.overrides)}, {args.steps} steps, 1 worker of 1 CPU on core {cores[0]}; "
          f"a {args.feed_cpus}-CPU node with no worker on cores {cores[1:]}")  # fmt: skip
    if "ray_data" in rates and "local" in rates:
        print(f"ratio ray_data / local  {rates['ray_data'][0] / rates['local'][0]:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
