"""Fixtures of the operator tests (helpers live in handlers_e2e_testlib.py and tj_builders.py): one local
cluster with the CRDs and the real operator per module for the end-to-end tests, and the jobs a test created
deleted after it."""

from __future__ import annotations

import subprocess

import pytest
from ftjob_local.client import ApiError
from ftjob_local.session import find_kubectl
from handlers_e2e_testlib import FAKE_TRAINER, JOBS, REPO, Env, make_operator
from support.cluster import local_cluster


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("handlers")
    fake = root / "fake_trainer.py"
    fake.write_text(FAKE_TRAINER)
    with local_cluster(root / "cluster", nodes=1, spot_nodes=2) as cluster:
        operator = make_operator(cluster.kubeconfig, root / "operator.log")
        try:
            subprocess.run(
                [find_kubectl(), "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", str(REPO / "crds")],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            operator.start()
            yield Env(cluster, operator, fake)
        finally:
            operator.stop()


@pytest.fixture
def jobs(env):
    """Deletes the jobs a test created (their pods go with them), so the next test has the CPUs."""
    yield env
    for name in env.created:
        try:
            env.kube.request("DELETE", f"{JOBS}/{name}")
        except ApiError:
            pass
    env.created.clear()
