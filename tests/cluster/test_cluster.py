"""Runs on a real multi-node Ray cluster on this host: a head and three worker nodes, each its own
`ray start` raylet with its own temp dir, ports and loopback address; checkpoints in an S3 bucket
(the local S3 server), metrics in an MLflow server on 127.0.0.1. The drivers are `convsts` commands
joined to the cluster through RAY_ADDRESS (or submitted to the head's dashboard), as on a real
cluster. A lost machine is a worker node's raylet killed with SIGKILL, everything under it too;
a replacement node then joins. Covered: workers spread over nodes, each run and each trial owns its
checkpoints in the bucket, training and a submitted job survive a lost node with the losses of an
undisturbed run, a sweep retries the trial whose node was lost, an impossible layout is refused, and
the credentials of a tracking URI are printed by no driver or worker."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from testkit.local_cluster import kill_node, mlflow_server, node_processes, ray_head, ray_worker_node
from testkit.s3_server import keys, s3_endpoint
from testkit.tiny import TINY_DAN, TINY_TRAIN

from convsts.ray_jobs.runtime.ray_start import PREEMPTION_WATCHER_ENV

REPO = Path(__file__).resolve().parents[2]
BUCKET = "s3://convsts-cluster"
PASSWORD = "Pl4ntedPassw0rd"  # made up: the user-info of the drivers' tracking URI

# One pytest-xdist process runs the module (its cluster is a module fixture): scripts/test.sh's --dist loadfile.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """{"env": a driver's environment joined to the cluster, "dashboard": ..., "mlflow": ..., "nodes":
    the worker nodes, "add_node": a function that starts one more}."""
    root = tmp_path_factory.mktemp("cluster")
    with contextlib.ExitStack() as stack:
        s3_env = stack.enter_context(s3_endpoint(BUCKET[len("s3://") :]))
        mlflow_url = stack.enter_context(mlflow_server(root / "mlflow"))
        # A lost node is marked dead after 3 failed health checks a second apart (Ray's defaults: 5,
        # 3 s apart); a busy live node still has Ray's 10 s timeout for each answer.
        health = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
        # Ray Train's preemption watcher as on a real cluster (the one-node test session turns it off).
        env = {**s3_env, **health, "RAY_AUTH_MODE": "disabled", PREEMPTION_WATCHER_ENV: "1"}
        head = stack.enter_context(ray_head(env, num_cpus=1))
        nodes: list[dict[str, str]] = []
        addresses = itertools.count(2)  # a node's loopback address is never another's, live or lost

        def add_node() -> dict[str, str]:
            nodes.append(stack.enter_context(ray_worker_node(head["gcs"], env, ip=f"127.0.0.{next(addresses)}")))
            return nodes[-1]

        add_node(), add_node(), add_node()  # 4 nodes of 1 CPU: a sweep's trial needs a node each (runtime/resources.py)
        driver = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_"))}
        # The drivers' tracking URI carries credentials, as a real server's may (this server takes
        # them without checking): no line of a run, from its driver or a worker, may print them.
        secret_url = mlflow_url.replace("http://", f"http://alice:{PASSWORD}@")
        driver.update(env, RAY_ADDRESS=head["gcs"], MLFLOW_TRACKING_URI=secret_url, RAY_USAGE_STATS_ENABLED="0")
        yield {"env": driver, "dashboard": head["address"], "mlflow": mlflow_url, "nodes": nodes, "add_node": add_node}


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


CLI = [sys.executable, "-m", "convsts"]


def _train_args(out: Path, prepared: Path, *overrides: str) -> list[str]:
    """`convsts train`'s arguments for a run named "shared" in the bucket."""
    return ["train", "--out", str(out), "--prepared", str(prepared), "name=shared",
            f"trainer.storage_path={BUCKET}/ray_results", *overrides]  # fmt: skip


def _train(cluster, out: Path, prepared: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        CLI + _train_args(out, prepared, *overrides), cwd=REPO, env=cluster["env"], capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip


def _history(client, run_id: str, name: str) -> dict[int, float]:
    points = client.get_metric_history(run_id, name)
    steps = [m.step for m in points]
    assert steps and len(steps) == len(set(steps)), (name, sorted(steps))  # each step once
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


def _kill_a_training_node(cluster, client, proc: subprocess.Popen, experiment: str) -> dict[str, str]:
    """Once the running training has checkpointed and gone on past it, SIGKILL the raylet (and all
    under it) of a worker node that hosts a task worker, as a lost machine; returns that node."""
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if _past_a_checkpoint(client, experiment):
            hosts = [n for n in cluster["nodes"] if node_processes(n, b"ray::RayTrainWorker")]
            assert hosts, "no worker node hosts a task worker"
            kill_node(hosts[0])
            return hosts[0]
        time.sleep(0.2)
    raise AssertionError(f"the run ended or never checkpointed before a node was lost: {_running(client, experiment)}")


def _run_losing_a_node(cluster, command: list[str], experiment: str = "cluster") -> str:
    """Run `command` (a training driver); once it has checkpointed, lose a worker node that hosts a
    task worker and let a replacement node join. Returns its output (it must exit 0)."""
    from mlflow.tracking import MlflowClient

    proc = subprocess.Popen(
        command, cwd=REPO, env=cluster["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lost = _kill_a_training_node(cluster, MlflowClient(cluster["mlflow"]), proc, experiment)
        cluster["nodes"].remove(lost)
        cluster["add_node"]()
        log = proc.communicate(timeout=600)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log[-4000:]
    return log


def _restarted_once_at_a_checkpoint(client, run_id: str, log: str) -> None:
    restarts = [int(m.value) for m in client.get_metric_history(run_id, "train/restarted_at_step")]
    starts = "\n".join(line for line in log.splitlines() if "start step" in line)
    assert len(restarts) == 1 and restarts[0] >= EVERY and restarts[0] % EVERY == 0, (restarts, starts)
    assert f"start step {restarts[0]}" in log


@pytest.fixture(scope="module")
def undisturbed(cluster, sample_prepared, tmp_path_factory) -> dict:
    """One undisturbed run of KILLABLE on the cluster: the reference the runs that lose a node are
    compared with, and the warm start of the sweep. Its train.json, with "out" and "log" added."""
    out = tmp_path_factory.mktemp("undisturbed") / "a"
    done = _train(cluster, out, sample_prepared, *KILLABLE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # MLflow's own "View run ... at: URL" lines (the driver's and the workers') and every other line
    # leave the tracking URI's credentials out; the run was tracked with them.
    assert PASSWORD not in done.stdout + done.stderr and "alice" not in done.stdout + done.stderr
    return {**json.loads((out / "train.json").read_text()), "out": out, "log": done.stdout + done.stderr}


def test_runs_on_a_cluster_spread_own_their_checkpoints_and_survive_a_lost_node(
    cluster, undisturbed, sample_prepared, tmp_path
):
    from mlflow.tracking import MlflowClient
    from ray.util.state import list_actors
    from safetensors.torch import load_file

    client = MlflowClient(cluster["mlflow"])
    info = undisturbed
    assert info["storage"].startswith(f"{BUCKET}/ray_results/shared/")
    assert json.loads((info["out"] / "checkpoint" / "config.json").read_text())["step"] == STEPS
    # SPREAD (the default placement): the two task workers ran on two distinct nodes.
    workers = list_actors(address=cluster["dashboard"], filters=[("class_name", "=", "RayTrainWorker")], limit=1000)
    assert len({w.node_id for w in workers}) == 2, workers
    # Checkpoints in the bucket, under the run's own folder.
    first_keys = set(keys(info["storage"]))
    assert any("/checkpoint-" in k and k.endswith("model.safetensors") for k in first_keys), sorted(first_keys)[:5]

    # A second run with the same name and storage path, submitted as a job to the head's dashboard
    # (its driver runs on the head), trains from step 0 in a folder of its own and leaves the first
    # run's files as they were. Past a checkpoint it
    # loses a worker node; a replacement node joins, the run goes on from there and the job SUCCEEDS.
    submit = ["submit", "--address", cluster["dashboard"], "--submission-id", "convsts-cluster-train"]
    log = _run_losing_a_node(
        cluster,
        CLI
        + submit
        + _train_args(tmp_path / "b", sample_prepared, *KILLABLE, f"mlflow.tracking_uri={cluster['mlflow']}"),
    )
    assert "job convsts-cluster-train: SUCCEEDED" in log and "start step 0" in log, log[-3000:]
    again = json.loads((tmp_path / "b" / "train.json").read_text())
    assert again["storage"] != info["storage"] and again["storage"].startswith(f"{BUCKET}/ray_results/shared/")
    assert set(keys(info["storage"])) == first_keys
    assert json.loads((tmp_path / "b" / "checkpoint" / "config.json").read_text())["step"] == STEPS
    run = client.get_run(again["mlflow_run_id"])
    assert run.data.tags["convsts.storage"] == again["storage"] and run.info.status == "FINISHED"
    # Restarted once, at a checkpoint, and said so.
    _restarted_once_at_a_checkpoint(client, again["mlflow_run_id"], log)
    # Each step's metrics once, and the same losses and weights as the undisturbed run, read from a
    # folder of many shards (the trainer's feed keeps one order whatever the read tasks' timing).
    assert len(list((sample_prepared / "reddit" / "train").glob("*.parquet"))) >= 8
    assert len(list((sample_prepared / "snli" / "train").glob("*.parquet"))) >= 8
    for name in ("reddit/loss", "snli/loss", "lr"):
        assert _history(client, again["mlflow_run_id"], name) == _history(client, info["mlflow_run_id"], name), name
    weights = [load_file(str(run / "checkpoint" / "model.safetensors")) for run in (info["out"], tmp_path / "b")]
    assert weights[0].keys() == weights[1].keys()
    assert [k for k in weights[0] if not torch.equal(weights[0][k], weights[1][k])] == []


def _complete_checkpoints(folder_uri: str) -> list[str]:
    """The checkpoint folders under a bucket prefix whose manifest (written last) is there, oldest step first."""
    folders = [k.rsplit("/", 1)[0] for k in keys(folder_uri) if k.endswith("/manifest.json")]
    return sorted(folders, key=lambda f: int(f.rsplit("-", 1)[1]))


def test_a_run_whose_driver_is_killed_goes_on_from_its_newest_complete_checkpoint(
    cluster, undisturbed, sample_prepared, tmp_path
):
    """`convsts train` with checkpoints in the bucket, its driver SIGKILLed after two checkpoints, the
    newer one left as an upload cut short leaves it (no train_state.pt). OUT holds only the run's
    record. The same command is refused in one line naming the newest complete checkpoint;
    `--resume latest` continues from it to trainer.steps; across the killed run (KILLED) and the one
    that continues it (tagged convsts.continues) every step is logged once, with the losses of an
    undisturbed run."""
    from mlflow.tracking import MlflowClient

    from convsts.io import storage

    out, client = tmp_path / "k", MlflowClient(cluster["mlflow"])
    command = CLI + _train_args(out, sample_prepared, *KILLABLE, "name=long", "mlflow.experiment=cluster-kill")
    proc = subprocess.Popen(command, cwd=REPO, env=cluster["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while (
            time.time() < deadline
            and proc.poll() is None
            and len(_complete_checkpoints(f"{BUCKET}/ray_results/long")) < 2
        ):
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        proc.kill()  # the driver dies: a killed job, a closed laptop, an OOM on the head
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.time() + 60  # Ray ends the dead driver's workers
    while any(node_processes(n, b"ray::RayTrainWorker") for n in cluster["nodes"]) and time.time() < deadline:
        time.sleep(0.5)
    record = json.loads((out / "run.json").read_text())["runs"][-1]  # the chain: this run alone
    assert not (out / "checkpoint").exists() and not (out / "train.json").exists()
    assert record["storage"].startswith(f"{BUCKET}/ray_results/long/")
    complete = _complete_checkpoints(record["storage"])
    assert len(complete) >= 2, complete
    older, newest = (f"s3://{k}" for k in complete[-2:])
    fs, inner = storage.resolve(f"{newest}/train_state.pt")
    fs.delete_file(inner)  # what a kill during the upload of the newest checkpoint leaves

    at = json.loads(storage.read_text(f"{older}/config.json"))["step"]
    again = _train(cluster, out, sample_prepared, *KILLABLE, "name=long", "mlflow.experiment=cluster-kill")
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    line = again.stderr.strip().splitlines()[-1]
    assert f"its newest complete checkpoint is {older} (step {at}); pass --resume latest to continue it" in line, line
    assert "an interrupted training run" in line and PASSWORD not in line

    resumed = _train(
        cluster, out, sample_prepared, *KILLABLE, "name=long", "mlflow.experiment=cluster-kill", "--resume"
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"start step {at}" in resumed.stdout + resumed.stderr
    train = json.loads((out / "train.json").read_text())
    assert json.loads((out / "checkpoint" / "config.json").read_text())["step"] == STEPS
    assert train["storage"] != record["storage"]  # the continuing run owns its folder too
    killed, continuing = client.get_run(record["run_id"]), client.get_run(train["mlflow_run_id"])
    assert killed.info.status == "KILLED" and continuing.info.status == "FINISHED"
    assert continuing.data.tags["convsts.continues"] == record["run_id"]
    for name in ("reddit/loss", "snli/loss", "lr"):
        first, then = _history(client, record["run_id"], name), _history(client, train["mlflow_run_id"], name)
        assert not set(first) & set(then), (name, sorted(set(first) & set(then)))  # each step once across the two
        assert {**first, **then} == _history(client, undisturbed["mlflow_run_id"], name), name


def test_a_sweep_retries_the_trial_whose_node_is_lost_from_its_own_checkpoint(
    cluster, undisturbed, sample_prepared, tmp_path
):
    """A two-trial SNLI-fraction sweep (`convsts tune`) with a bucket storage path: a worker node of a
    running trial is lost; its training does not retry itself (trainer.max_failures=0), so the trial
    fails and Tune retries it (--max-failures) from the trial's own last checkpoint. Every trial
    starts at step 0 in a folder of its own; the curve has a row per trial, each its own metrics."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    out = tmp_path / "sweep"
    command = [*CLI, "tune", "--space", "snli_fraction", "--out", str(out),
               "--reddit-checkpoint", str(undisturbed["out"] / "checkpoint"), "--prepared", str(sample_prepared),
               "--param", "data.snli_fraction=[0.5,1.0]", "--param", "seed=[0]", "--max-failures", "2", "name=sweep",
               f"trainer.storage_path={BUCKET}/sweeps", *KILLABLE, "trainer.max_failures=0",
               "mlflow.experiment=cluster-sweep"]  # fmt: skip
    log = _run_losing_a_node(cluster, command, experiment="cluster-sweep")
    assert PASSWORD not in log and "alice" not in log
    results = json.loads((out / "results.json").read_text())
    assert results["trials"] == 2 and results["failed_trials"] == [], results
    curve = pd.read_csv(out / "curve.csv")
    assert list(curve["fraction"]) == [0.5, 1.0], curve
    assert curve["data/snli_train_pairs"].nunique() == 2 and curve["stsb/dev/pearson"].between(-1, 1).all()

    client = MlflowClient(cluster["mlflow"])
    experiment = client.get_experiment_by_name("cluster-sweep").experiment_id
    children = [r for r in client.search_runs([experiment]) if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children), children
    storages = {r.data.tags["convsts.storage"] for r in children}
    assert len(storages) == 2 and all(s.startswith(f"{BUCKET}/sweeps/sweep/") for s in storages), storages
    retried = []
    for run in children:
        losses = _history(client, run.info.run_id, "reddit/loss")  # each step once
        assert min(losses) < EVERY and max(losses) == STEPS, (run.info.run_id, min(losses), max(losses))
        retried += [int(m.value) for m in client.get_metric_history(run.info.run_id, "train/restarted_at_step")]
    # The lost trial went on from its own checkpoint, not from step 0 nor from the other trial's.
    assert len(retried) == 1 and retried[0] >= EVERY and retried[0] % EVERY == 0, (retried, log[-3000:])


def test_a_layout_that_fits_no_node_is_refused_before_any_work(cluster, sample_prepared, tmp_path):
    # 1.5 CPUs per worker: the cluster has 4 CPUs in all but no node with more than 1.
    refused = _train(cluster, tmp_path / "c", sample_prepared, *TINY_TRAIN, "trainer.cpus_per_worker=1.5")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert (
        "do not fit on the cluster's 4 node(s): 1 CPU, 1 CPU, 1 CPU, 1 CPU" in line
        and "trainer.cpus_per_worker" in line
    )
    assert not (tmp_path / "c" / "train.json").exists()


def test_a_distributed_prepare_writes_a_local_folder_on_the_commands_node(cluster, tmp_path, monkeypatch):
    """`convsts prepare reddit` on the Ray path (data.dump_local_bytes=0) joined to the cluster: a
    local --out is the command's machine's, so every task that writes its shards runs on the
    command's node, while the cluster's other nodes are free; a bucket's shards are written from the
    cluster as well. Both hold the streaming engine's shards byte for byte."""
    from ray.util.state import list_jobs, list_nodes, list_tasks
    from testkit.dumps import prepare_bench

    dump = tmp_path / "RC_synthetic.zst"
    prepare_bench().write_dump(dump, 20_000)
    # Ray's state API asked by the cluster's dashboard URL: an address in the environment would win
    # over the one given (this process may be joined to the test session's own instance).
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    dashboard = cluster["dashboard"]

    def prepare(out: str, *overrides: str) -> dict:
        done = subprocess.run(CLI + ["prepare", "reddit", "--input", str(dump), "--out", out, *overrides],
                              cwd=REPO, env=cluster["env"], capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return {k: v for k, v in json.loads(done.stdout).items() if k in ("shards", "pairs", "lines_read")}

    def writes() -> list:
        return [t for name in ("_write_range_task", "_write_pieces_task")
                for t in list_tasks(dashboard, filters=[("name", "=", name)], detail=True, limit=10_000)]  # fmt: skip

    engine = prepare(str(tmp_path / "engine"))  # under data.dump_local_bytes: in the command's process
    assert prepare(str(tmp_path / "local"), "data.dump_local_bytes=0") == engine
    local = writes()
    node_ip = {n.node_id: n.node_ip for n in list_nodes(dashboard, limit=100)}
    drivers = {j.job_id: j.driver_info.node_ip_address for j in list_jobs(dashboard) if j.driver_info}
    assert len(local) >= 4 and {t.job_id for t in local} <= set(drivers), local  # a write task per key range
    assert {node_ip[t.node_id] for t in local} == {drivers[t.job_id] for t in local}, [
        (t.name, node_ip[t.node_id], drivers[t.job_id]) for t in local
    ]
    assert prepare(f"{BUCKET}/prepared", "data.dump_local_bytes=0") == engine
    assert len(writes()) > len(local)
