"""The multi-node cluster on one host that tests/cluster/multinode/ shares (its conftest makes it
once), and what its tests do with it: run `convsts train` in the bucket, wait for a registered
checkpoint, lose a node that hosts a task worker, read a run's metric history."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from convsts.ray_jobs.runtime.ray_start import PREEMPTION_WATCHER_ENV
from testkit.local_cluster import kill_node, mlflow_server, node_processes, ray_head, ray_worker_node
from testkit.s3_server import keys, s3_endpoint
from testkit.tiny import TINY_DAN

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "convsts"]
BUCKET = "s3://convsts-cluster"
PASSWORD = "Pl4ntedPassw0rd"  # made up: the user-info of the drivers' tracking URI

STEPS, EVERY = 200, 50
# Long enough to lose a node between the first checkpoint and the end (a tiny step on this cluster
# takes about 0.1 s); the runs have an MLflow experiment of their own.
KILLABLE = [
    f"trainer.steps={STEPS}",
    f"trainer.checkpoint_every={EVERY}",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.max_failures=2",
    *TINY_DAN,
    "mlflow.experiment=cluster",
]


@dataclass
class Cluster:
    """A head and its worker nodes: `env` is a driver's environment joined to the cluster (its
    tracking URI carries PASSWORD); `nodes` the live worker nodes ({"temp_dir": ..., "cpus": n})."""

    env: dict[str, str]
    dashboard: str
    mlflow: str
    gcs: str
    node_env: dict[str, str]
    nodes: list[dict] = field(default_factory=list)
    stops: dict[str, contextlib.ExitStack] = field(default_factory=dict)
    row_trace: Path | None = None  # where the nodes' workers write testkit.counted_task's trace, if they do
    addresses: itertools.count = field(default_factory=lambda: itertools.count(2))

    def add_node(self, cpus: int) -> dict:
        """One more worker node of `cpus` CPUs, at a loopback address no node had before, live or lost."""
        stop = contextlib.ExitStack()
        node = stop.enter_context(
            ray_worker_node(self.gcs, self.node_env, num_cpus=cpus, ip=f"127.0.0.{next(self.addresses)}")
        )
        self.stops[node["temp_dir"]] = stop
        self.nodes.append({**node, "cpus": cpus})
        return self.nodes[-1]

    def lose(self, node: dict) -> None:
        """A lost machine: SIGKILL the node's raylet and everything under it, as it stands."""
        kill_node(node)
        self._remove(node)

    def layout(self, cpus: int, count: int) -> Cluster:
        """Exactly `count` live worker nodes of `cpus` CPUs each (others are stopped), every one of
        them known to the head as alive when this returns."""
        for node in [n for n in self.nodes if n["cpus"] != cpus] + [n for n in self.nodes if n["cpus"] == cpus][count:]:
            self._remove(node)
        while len(self.nodes) < count:
            self.add_node(cpus)
        self.wait_for_live_nodes(1 + count)
        return self

    def wait_for_live_nodes(self, alive: int) -> None:
        from ray.util.state import list_nodes

        deadline = time.time() + 120  # every node the head knows, lost ones too, filtered here (the state
        # API's own filter counts the lost ones against its limit and raises)
        while (seen := sum(n.state == "ALIVE" for n in list_nodes(self.dashboard, limit=10_000))) != alive:
            assert time.time() < deadline, f"{seen} live nodes, not {alive}"
            time.sleep(0.5)

    def close(self) -> None:
        for node in list(self.nodes):
            self._remove(node)

    def _remove(self, node: dict) -> None:
        self.nodes.remove(node)
        self.stops.pop(node["temp_dir"]).close()  # its processes stopped by pid


@contextlib.contextmanager
def cluster_on_this_host(root: Path, extra_env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A head of one CPU, an S3 server and an MLflow server (its files under `root`), all stopped by
    their pids at the end; worker nodes come and go with the tests (`Cluster.layout`, `lose`,
    `add_node`). `extra_env`: more of every node's and driver's environment. A package's conftest
    makes one for its files."""
    with contextlib.ExitStack() as stack:
        s3_env = stack.enter_context(s3_endpoint(BUCKET[len("s3://") :]))
        mlflow_url = stack.enter_context(mlflow_server(root / "mlflow"))
        # A lost node is marked dead after 3 failed health checks a second apart (Ray's defaults: 5,
        # 3 s apart); a busy live node still has Ray's 10 s timeout for each answer.
        health = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
        # Ray Train's preemption watcher as on a real cluster (a one-node local instance turns it off).
        node_env = {**s3_env, **health, "RAY_AUTH_MODE": "disabled", PREEMPTION_WATCHER_ENV: "1", **(extra_env or {})}
        head = stack.enter_context(ray_head(node_env, num_cpus=1))
        # This process asks Ray's state API by the dashboard's URL: an address in its environment would win.
        for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
            if name in os.environ:
                stack.callback(os.environ.__setitem__, name, os.environ.pop(name))
        driver = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_"))}
        secret_url = mlflow_url.replace("http://", f"http://alice:{PASSWORD}@")
        driver.update(node_env, RAY_ADDRESS=head["gcs"], MLFLOW_TRACKING_URI=secret_url, RAY_USAGE_STATS_ENABLED="0")
        found = Cluster(driver, head["address"], mlflow_url, head["gcs"], node_env)
        stack.callback(found.close)
        yield found


def train_args(out: Path, prepared: Path, *overrides: str) -> list[str]:
    """`convsts train`'s arguments for a run named "shared" in the bucket."""
    return ["train", "--out", str(out), "--prepared", str(prepared), "name=shared",
            f"trainer.storage_path={BUCKET}/ray_results", *overrides]  # fmt: skip


def train(cluster: Cluster, out: Path, prepared: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        CLI + train_args(out, prepared, *overrides), cwd=REPO, env=cluster.env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip


def history(client, run_id: str, name: str) -> dict[int, float]:
    """A metric's points by step; each step once."""
    points = client.get_metric_history(run_id, name)
    steps = [m.step for m in points]
    assert steps and len(steps) == len(set(steps)), (name, sorted(steps))
    return {m.step: m.value for m in points}


def _registered_checkpoint(storage_uri: str) -> bool:
    """Whether Ray Train's controller has registered a checkpoint of the run (its checkpoint manager's
    snapshot names a latest one): the files of a reported checkpoint land in the bucket a moment
    earlier, and a node lost in between restarts the run from the checkpoint before that."""
    from convsts.io import storage

    for key in keys(storage_uri):
        if key.endswith("/checkpoint_manager_snapshot.json"):
            with storage.open_text(f"s3://{key}") as f:
                return json.load(f).get("latest_checkpoint_result") is not None
    return False


def _past_a_checkpoint(client, experiment: str) -> bool:
    """Whether a running training (a run, or a trial's child run) of `experiment` has a registered
    checkpoint and has logged steps past it."""
    exp = client.get_experiment_by_name(experiment)
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'") if exp else []:
        if "convsts.storage" in run.data.tags and _registered_checkpoint(run.data.tags["convsts.storage"]):
            points = client.get_metric_history(run.info.run_id, "reddit/loss")
            if max((m.step for m in points), default=0) >= EVERY + 10:
                return True
    return False


def _running(client, experiment: str) -> list[tuple]:
    """What _past_a_checkpoint saw: (run name, status, storage, registered, last step) of each run."""
    exp = client.get_experiment_by_name(experiment)
    seen = []
    for run in client.search_runs([exp.experiment_id]) if exp else []:
        where = run.data.tags.get("convsts.storage", "")
        points = client.get_metric_history(run.info.run_id, "reddit/loss")
        last = max((m.step for m in points), default=None)
        seen.append((run.info.run_name, run.info.status, where, where and _registered_checkpoint(where), last))
    return seen


def training_hosts(cluster: Cluster) -> list[dict]:
    """The worker nodes that host a task worker now."""
    return [n for n in cluster.nodes if node_processes(n, b"ray::RayTrainWorker")]


def lose_a_training_node(cluster: Cluster, client, proc: subprocess.Popen, experiment: str) -> dict:
    """Once the running training has checkpointed and gone on past it, lose a worker node that hosts
    a task worker; returns that node."""
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if _past_a_checkpoint(client, experiment):
            hosts = training_hosts(cluster)
            assert hosts, "no worker node hosts a task worker"
            cluster.lose(hosts[0])
            return hosts[0]
        time.sleep(0.2)
    raise AssertionError(f"the run ended or never checkpointed before a node was lost: {_running(client, experiment)}")


def run_losing_a_node(cluster: Cluster, command: list[str], experiment: str = "cluster") -> str:
    """Run `command` (a training driver); once it has checkpointed, lose a worker node that hosts a
    task worker and let a replacement node join. Returns its output (it must exit 0)."""
    from mlflow.tracking import MlflowClient

    proc = subprocess.Popen(
        command, cwd=REPO, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lost = lose_a_training_node(cluster, MlflowClient(cluster.mlflow), proc, experiment)
        cluster.add_node(lost["cpus"])
        log = proc.communicate(timeout=600)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log[-4000:]
    return log
