"""One elastic run's pairs/s at each size it takes: `convsts train "trainer.num_workers=[1,N]"` on a
cluster on this host (a head of one CPU, which no task worker fits, and N worker nodes of two CPUs, one
2-CPU task worker each; each node its own raylet, as the cluster tests do), losing one node each time the group has logged --windows windows at its size,
down to one worker, then a node joining again so the group grows.

  .venv/bin/python bench/elastic_throughput.py [--nodes 3] [--steps 3000] [--windows 6]

Prints, for each size in the order the run took them: the logged windows at that size, the median
pairs/s over them (the configured batch x the group's size / the window's mean step time; the
first window after each restart is left out) and the ratio to the size-1 figure; then the run's
restarts and its whole time. Uses the embedded sample, the tiny DAN and a local MLflow store.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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

from testkit.local_cluster import kill_node, mlflow_server, node_processes, ray_head, ray_worker_node  # noqa: E402
from testkit.tiny import TINY_DAN  # noqa: E402

from convsts.ray_jobs.runtime.run_folder import RunFolder  # noqa: E402

BATCH = 32  # TINY_DAN's stage batch size
LOG = 10


def _history(client, run_id: str, name: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, name)}


def _run_id(out: Path) -> str | None:
    record = RunFolder(out).run_record
    runs = json.loads(record.read_text()).get("runs", []) if record.exists() else []
    return runs[-1]["run_id"] if runs else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3, help="two-CPU worker nodes, and the group's MAX")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--windows", type=int, default=6, help="logged windows at each size before a node goes")
    args = parser.parse_args()
    from mlflow.tracking import MlflowClient

    work = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    env = {"RAY_AUTH_MODE": "disabled", "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
    with contextlib.ExitStack() as stack:
        uri = stack.enter_context(mlflow_server(work / "mlflow"))
        head = stack.enter_context(ray_head(env, num_cpus=1))
        addresses = itertools.count(2)

        def node():
            return stack.enter_context(ray_worker_node(head["gcs"], env, num_cpus=2, ip=f"127.0.0.{next(addresses)}"))

        nodes = [node() for _ in range(args.nodes)]
        driver = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_"))}
        driver.update(env, RAY_ADDRESS=head["gcs"], MLFLOW_TRACKING_URI=uri, RAY_USAGE_STATS_ENABLED="0")
        driver["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = "20"
        out = work / "run"
        command = [sys.executable, "-m", "convsts", "train", "--out", str(out), "name=elastic-bench",
                   f"trainer.num_workers=[1,{args.nodes}]", "trainer.cpus_per_worker=2", "trainer.torch_threads=1", "trainer.resize_interval_s=5",
                   f"trainer.max_failures={args.nodes + 2}", f"trainer.steps={args.steps}", "trainer.checkpoint_every=50",
                   f"trainer.log_every={LOG}", "trainer.eval_every=0", *TINY_DAN]  # fmt: skip
        started = time.time()
        # The run's output to a file: a pipe read only at the end fills and stops the run.
        output = stack.enter_context(open(work / "train.log", "w+"))
        proc = subprocess.Popen(command, cwd=REPO, env=driver, stdout=output, stderr=subprocess.STDOUT, text=True)
        client = MlflowClient(uri)
        grown, acted_at = False, -1  # the last logged step when a node was lost or added
        while proc.poll() is None:
            run_id = _run_id(out)
            workers = _history(client, run_id, "train/workers") if run_id else {}
            if workers and not grown:
                size = workers[max(workers)]
                # Windows logged at this size since the last change (until the group restarts, the
                # last logged size is the one before it: nothing is done then).
                at_size = [step for step, n in workers.items() if n == size and step > acted_at]
                if len(at_size) > args.windows and size > 1:
                    hosts = [n for n in nodes if node_processes(n, b"ray::RayTrainWorker")]
                    if hosts:
                        kill_node(hosts[0])
                        nodes.remove(hosts[0])
                        acted_at = max(workers)
                elif len(at_size) > args.windows:
                    nodes.append(node())
                    grown, acted_at = True, max(workers)
            time.sleep(1.0)
        proc.wait()
        log = (work / "train.log").read_text()
        whole = time.time() - started
        if proc.returncode != 0:
            print(log[-4000:])
            return 1
        run_id = _run_id(out)
        workers, times = _history(client, run_id, "train/workers"), _history(client, run_id, "step_time_s")
    segments: list[tuple[int, list[float]]] = []
    for step in sorted(workers):
        size = int(workers[step])
        if not segments or segments[-1][0] != size:
            segments.append((size, []))  # the first window after a restart holds the restart: left out
            continue
        segments[-1][1].append(BATCH * size / times[step])
    base = statistics.median(next(rates for size, rates in segments if size == 1 and rates))
    print(f"one elastic run [1,{args.nodes}], tiny DAN, batch {BATCH} a rank, {args.steps} steps, two-CPU nodes")
    print("| group size | windows | pairs/s (median) | / 1 worker |")
    print("|---|---|---|---|")
    for size, rates in segments:
        if rates:
            median = statistics.median(rates)
            print(f"| {size} | {len(rates)} | {median:,.0f} | {median / base:.2f} |")
    resized = [line.split("] ", 1)[1] for line in log.splitlines() if "worker group resized" in line]
    print(f"\n{len(resized)} resizes; whole run {whole:.0f} s")
    for line in resized:
        print(f"  {line[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
