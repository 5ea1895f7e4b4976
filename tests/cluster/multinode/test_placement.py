"""Where work goes on the multi-node cluster (conftest.py): a layout that fits no node is refused
before any work, and a distributed prepare writes a local folder's shards on the command's node."""

from __future__ import annotations

import json
import subprocess

import pytest
from testkit.multinode import BUCKET, CLI, REPO, train
from testkit.tiny import TINY_TRAIN

pytestmark = pytest.mark.slow


def test_a_layout_that_fits_no_node_is_refused_before_any_work(one_cpu_nodes, sample_prepared, tmp_path):
    # 1.5 CPUs per worker: the cluster has 4 CPUs in all but no node with more than 1.
    refused = train(one_cpu_nodes, tmp_path / "c", sample_prepared, *TINY_TRAIN, "trainer.cpus_per_worker=1.5")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert (
        "do not fit on the cluster's 4 node(s): 1 CPU, 1 CPU, 1 CPU, 1 CPU" in line
        and "trainer.cpus_per_worker" in line
    )
    assert not (tmp_path / "c" / "train.json").exists()


def test_a_distributed_prepare_writes_a_local_folder_on_the_commands_node(one_cpu_nodes, tmp_path):
    """`convsts prepare reddit` on the Ray path (data.dump_local_bytes=0) joined to the cluster: a
    local --out is the command's machine's, so every task that writes its shards runs on the
    command's node, while the cluster's other nodes are free; a bucket's shards are written from the
    cluster as well. Both hold the streaming engine's shards byte for byte."""
    from ray.util.state import list_jobs, list_nodes, list_tasks
    from testkit.dumps import prepare_bench

    cluster = one_cpu_nodes
    dump = tmp_path / "RC_synthetic.zst"
    prepare_bench().write_dump(dump, 20_000)

    def prepare(out: str, *overrides: str) -> dict:
        done = subprocess.run(CLI + ["prepare", "reddit", "--input", str(dump), "--out", out, *overrides],
                              cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return {k: v for k, v in json.loads(done.stdout).items() if k in ("shards", "pairs", "lines_read")}

    def writes() -> list:
        return [t for name in ("_write_range_task", "_write_pieces_task")
                for t in list_tasks(cluster.dashboard, filters=[("name", "=", name)], detail=True, limit=10_000)]  # fmt: skip

    engine = prepare(str(tmp_path / "engine"))  # under data.dump_local_bytes: in the command's process
    assert prepare(str(tmp_path / "local"), "data.dump_local_bytes=0") == engine
    local = writes()
    node_ip = {n.node_id: n.node_ip for n in list_nodes(cluster.dashboard, limit=100)}
    drivers = {j.job_id: j.driver_info.node_ip_address for j in list_jobs(cluster.dashboard) if j.driver_info}
    assert len(local) >= 4 and {t.job_id for t in local} <= set(drivers), local  # a write task per key range
    assert {node_ip[t.node_id] for t in local} == {drivers[t.job_id] for t in local}, [
        (t.name, node_ip[t.node_id], drivers[t.job_id]) for t in local
    ]
    assert prepare(f"{BUCKET}/prepared", "data.dump_local_bytes=0") == engine
    assert len(writes()) > len(local)
