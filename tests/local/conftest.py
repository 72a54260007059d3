"""Fixtures of the local cluster tests (helpers live in apiserver_client_testlib.py and node_cluster_testlib.py):
an embedded API server for the `kubernetes` client tests, and one local cluster per module for the node agent
tests."""

from __future__ import annotations

import pytest
from apiserver_client_testlib import api_client
from ftjob_local.apiserver import start_in_thread
from ftjob_local.client import Kube
from support.cluster import local_cluster


@pytest.fixture()
def server(tmp_path):
    handle = start_in_thread(str(tmp_path / "state"))
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture()
def api(server):
    with api_client(server.url) as c:
        yield c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_cluster(tmp_path_factory.mktemp("cluster"), nodes=1, spot_nodes=1) as c:
        yield c


@pytest.fixture(scope="module")
def kube(cluster):
    return Kube(str(cluster.kubeconfig))
