"""One real multi-node Ray cluster on this host for every test in this folder (a package, so that
its fixtures end with its last test), made once: a head of one CPU and worker nodes, each its own
`ray start` raylet with its own temp dir, ports and loopback address; checkpoints in an S3 bucket
(the local S3 server), metrics in an MLflow server on 127.0.0.1. The drivers are `convsts` commands
joined through RAY_ADDRESS, as on a real cluster (a job submitted to a head's dashboard is
tests/cluster/test_submit.py's). The folder's files run in one pytest-xdist process, one after
another (a test package is one scope of testkit.scheduling); each test asks for the worker nodes it
needs (`Cluster.layout`), and a lost machine is a worker node's raylet killed with SIGKILL,
everything under it too (`Cluster.lose`). The drivers' tracking URI carries credentials, as a real
server's may (this server takes them without checking): no line of a run may print them."""

from __future__ import annotations

import json

import pytest
from testkit.multinode import KILLABLE, Cluster, cluster_on_this_host, train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    """The head, the S3 server and the MLflow server; worker nodes come and go with the tests."""
    with cluster_on_this_host(tmp_path_factory.mktemp("cluster")) as found:
        yield found


@pytest.fixture
def one_cpu_nodes(cluster) -> Cluster:
    """The cluster with three worker nodes of one CPU beside its one-CPU head (a sweep's trial needs
    a node each: runtime/resources.py)."""
    return cluster.layout(cpus=1, count=3)


@pytest.fixture(scope="package")
def undisturbed(cluster, sample_prepared, tmp_path_factory) -> dict:
    """One undisturbed run of KILLABLE on three one-CPU nodes: the reference the runs that lose a node
    or their driver are compared with, and the sweep's warm start. Its train.json, with "out", "log"
    and "worker_nodes" (the nodes of the run's own task workers) added."""
    from ray.util.state import list_actors

    def workers() -> dict[str, str]:
        found = list_actors(cluster.dashboard, filters=[("class_name", "=", "RayTrainWorker")], limit=10_000)
        return {a.actor_id: a.node_id for a in found}

    cluster.layout(cpus=1, count=3)
    before = workers()
    out = tmp_path_factory.mktemp("undisturbed") / "a"
    done = train(cluster, out, sample_prepared, *KILLABLE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "train.json").read_text())
    own = [node for actor, node in workers().items() if actor not in before]
    return {**record, "out": out, "log": done.stdout + done.stderr, "worker_nodes": own}
