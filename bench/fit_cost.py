"""What one tiny `convsts train` costs in CPU, process by process: the floor of every test that trains.

  .venv/bin/python bench/fit_cost.py [--prepared DIR] [--variants local:1 local:2 ray_data:1]

Starts one local Ray instance (2 CPUs), prepares the embedded sample where no --prepared is given
(tests/testkit/tiny.py's SAMPLE_PREPARE), then runs a 6-step fit of the tiny DAN for each variant
(trainer.feed:trainer.num_workers), each a `convsts train` that joins the instance (RAY_ADDRESS) as
the tests' runs do. While a fit runs, every process of the machine is sampled every 0.1 s; a
process's CPU seconds (user + system) are counted from its last sample. Prints, per variant, the
fit's wall seconds, its core-seconds in all and by process kind (the driver, each Ray actor's name,
Ray's idle pooled workers), the driver's and each worker's share. The steps themselves take under a
second: what a fit costs is its processes' start (each imports Ray, most torch and MLflow).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from testkit.tiny import SAMPLE_PREPARE, TINY_DAN  # noqa: E402

STEPS = ["trainer.steps=6", "trainer.log_every=2", "trainer.checkpoint_every=3", "trainer.eval_every=0"]


def _kind(cmdline: str, driver: int, pid: int) -> str | None:
    """What a process is to the fit: the driver, a Ray actor by its name, Ray's other processes."""
    if pid == driver:
        return "driver (convsts train)"
    if cmdline.startswith("ray::IDLE"):
        return "ray::IDLE (pooled workers: tasks, the feed's map_batches among them)"
    if cmdline.startswith("ray::"):
        return cmdline.split()[0].split(".")[0]  # an actor by its class, whichever method it runs
    if "setup_worker.py" in cmdline or "default_worker.py" in cmdline:
        return "ray worker, ahead of its task (runtime env setup, imports)"
    return None


def _sample(seen: dict[tuple[int, float], tuple[str, float]]) -> None:
    for proc in psutil.process_iter(["pid", "cmdline", "cpu_times", "create_time"]):
        times, key = proc.info["cpu_times"], (proc.info["pid"], proc.info["create_time"])
        if times is not None:  # a process's last name that is not empty: a dying one's reads empty
            name = " ".join(proc.info["cmdline"] or []) or seen.get(key, ("", 0.0))[0]
            seen[key] = (name, times.user + times.system)


def fit_cost(prepared: Path, feed: str, workers: int, env: dict[str, str]) -> tuple[float, collections.Counter]:
    """(wall seconds, core-seconds by process kind) of one tiny fit."""
    at_start: dict[tuple[int, float], tuple[str, float]] = {}
    _sample(at_start)
    with tempfile.TemporaryDirectory(prefix="fitcost-") as out:
        command = [sys.executable, "-m", "convsts", "train", "--out", out, "--prepared", str(prepared), *TINY_DAN,
                   *STEPS, f"trainer.feed={feed}", f"trainer.num_workers={workers}"]  # fmt: skip
        began = time.perf_counter()
        driver = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seen = dict(at_start)
        while driver.poll() is None:
            _sample(seen)
            time.sleep(0.1)
        wall = time.perf_counter() - began
        if driver.returncode != 0:
            raise SystemExit(f"fit_cost: {feed}:{workers} failed:\n{driver.stderr.read().decode()[-3000:]}")
    costs: collections.Counter = collections.Counter()
    for key, (cmdline, cpu) in seen.items():
        spent = cpu - at_start.get(key, ("", 0.0))[1]
        kind = _kind(cmdline, driver.pid, key[0])
        if kind is not None and spent > 0.05:
            costs[kind] += spent
    return wall, costs


def variant(text: str) -> tuple[str, int]:
    """FEED:WORKERS, e.g. local:2."""
    feed, _, workers = text.partition(":")
    if feed not in ("local", "ray_data") or not workers.isdigit() or int(workers) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a variant is FEED:WORKERS, FEED local or ray_data, e.g. local:2")
    return feed, int(workers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepared", help="a prepared folder (default: the embedded sample, prepared here)")
    parser.add_argument("--variants", nargs="+", type=variant, default=[("local", 1), ("local", 2), ("ray_data", 1)])
    args = parser.parse_args()
    import ray

    with tempfile.TemporaryDirectory(prefix="fitcost-") as scratch:
        prepared = Path(args.prepared) if args.prepared else Path(scratch) / "prepared"
        if not args.prepared:
            from convsts.ray_jobs.config.loader import load_config
            from convsts.ray_jobs.pipelines.inputs import prepare_all

            prepare_all(load_config(None, SAMPLE_PREPARE), str(prepared))
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        try:
            env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
            for feed, workers in args.variants:
                wall, costs = fit_cost(prepared, feed, workers, env)
                print(f"\n{feed}:{workers}: wall {wall:.1f} s, {sum(costs.values()):.1f} core-s")
                print("| process | core-s |\n|---|---|")
                for kind, seconds in costs.most_common():
                    print(f"| {kind} | {seconds:.1f} |")
        finally:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
