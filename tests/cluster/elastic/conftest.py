"""A multi-node Ray cluster on this host of its own for the elastic runs (a package, so that its
fixture ends with its last test): the same kind as tests/cluster/multinode/'s (testkit.multinode),
made apart from it so that the two scopes run in the two pytest-xdist processes side by side rather
than one after the other. An elastic run's node losses and joins are the cluster's whole layout
while it runs, so it could not share a cluster with another test running at the same time. Its
workers import the test helpers (testkit.counted_task) and write the rows they train on to the
cluster's row trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import counted_task
from testkit.multinode import REPO, cluster_on_this_host

pytestmark = pytest.mark.slow

COUNTED_ROWS = 1000


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    """The head, the S3 server and the MLflow server; the test sets its worker nodes. Its `row_trace`:
    the folder its workers write counted_task's trace to."""
    root = tmp_path_factory.mktemp("elastic_cluster")
    trace = root / "row_trace"
    trace.mkdir()
    env = {"PYTHONPATH": str(REPO / "tests"), counted_task.TRACE_ENV: str(trace)}
    with cluster_on_this_host(root, env) as found:
        found.row_trace = trace
        yield found


@pytest.fixture(scope="package")
def counted_prepared(tmp_path_factory) -> Path:
    """A prepared folder holding counted_task's COUNTED_ROWS rows in shards of 100 rows (prepared as
    `convsts prepare counted` does)."""
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.tasks import get_task

    root = tmp_path_factory.mktemp("counted")
    counted_task.rows(COUNTED_ROWS).to_json(root / "counted.jsonl", orient="records", lines=True)
    inputs = f"data.task_inputs={{counted: [{root / 'counted.jsonl'}]}}"
    cfg = load_config(None, ["task_modules=[testkit.counted_task]", inputs, "data.rows_per_shard=100"])
    task = get_task("counted", cfg.task_modules)
    task.prepare(task.raw_inputs(cfg), task.prepared_dir(str(root / "prepared")), cfg)
    return root / "prepared"
