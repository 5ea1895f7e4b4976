"""A multi-node Ray cluster on this host of its own for the elastic runs (a package, so that its
fixture ends with its last test): the same kind as tests/cluster/multinode/'s (testkit.multinode),
made apart from it so that the two scopes run in the two pytest-xdist processes side by side rather
than one after the other. An elastic run's node losses and joins are the cluster's whole layout
while it runs, so it could not share a cluster with another test running at the same time."""

from __future__ import annotations

import pytest
from testkit.multinode import cluster_on_this_host

pytestmark = pytest.mark.slow


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    """The head, the S3 server and the MLflow server; the test sets its worker nodes."""
    with cluster_on_this_host(tmp_path_factory.mktemp("elastic_cluster")) as found:
        yield found
