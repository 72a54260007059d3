"""Two `ftjob operator --peering NAME` replicas (as the chart deploys them with replicaCount 2) against the local
cluster with kopf's peering CRDs from the chart: the peering object is created by the operator, both replicas
keep it alive with distinct priorities, one works and the other stands by, and the job gets one set of pods.
"""

from __future__ import annotations

import subprocess

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
]

from ftjob_local.session import find_kubectl  # noqa: E402
from handlers_e2e_testlib import FAKE_TRAINER, REPO, Env, make_operator  # noqa: E402
from support.cluster import local_cluster  # noqa: E402
from support.operator_process import OperatorProcess  # noqa: E402
from support.wait import wait_until  # noqa: E402

PEERING = "ftjob-test"


class Both:
    """Both replicas' logs, for what a failed wait prints."""

    def __init__(self, ops: list[OperatorProcess]):
        self.ops = ops

    def log_tail(self) -> str:
        return "\n".join(f"--- {op.log_path.name}\n{op.log_tail(60)}" for op in self.ops)


@pytest.fixture
def replicas(tmp_path):
    fake = tmp_path / "fake_trainer.py"
    fake.write_text(FAKE_TRAINER)
    with local_cluster(tmp_path / "cluster", nodes=1, spot_nodes=2) as cluster:
        ops = [make_operator(cluster.kubeconfig, tmp_path / f"operator-{i}.log", PEERING) for i in range(2)]
        try:
            kubectl = [find_kubectl(), "--kubeconfig", str(cluster.kubeconfig)]
            peering_crds = subprocess.run(
                [str(REPO / ".venv" / "bin" / "helm"), "template", "x", str(REPO / "charts" / "ftjob"),
                 "--set", "peering.enabled=true", "--set", "clusterWide=true", "--show-only", "templates/peering-crds.yaml"],
                check=True, capture_output=True, text=True, timeout=60,
            ).stdout  # fmt: skip
            subprocess.run([*kubectl, "apply", "-f", "-"], input=peering_crds, check=True, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
            subprocess.run(
                [*kubectl, "apply", "-f", str(REPO / "crds")], check=True, capture_output=True, timeout=60
            )
            for op in ops:
                op.start()
            yield Env(cluster, ops[0], fake), ops
        finally:
            for op in ops:
                op.stop()


def test_two_peered_replicas_create_one_set_of_pods(replicas):
    env, ops = replicas
    # Both replicas joined the peering the operator created: one keep-alive each in its status.
    keepalives = wait_until(
        lambda: (
            len((env.kube.get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{PEERING}") or {}).get("status") or {})
            == 2
            and env.kube.get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{PEERING}")["status"]
        ),
        30,
        "both replicas' keep-alives in the ClusterKopfPeering",
        diagnose=Both(ops).log_tail,
    )
    assert len({v["priority"] for v in keepalives.values()}) == 2, (
        keepalives
    )  # distinct: one active, one standby
    name = "peered"
    env.create_job(name, "serve")
    env.until(
        lambda: env.status(name).get("phase") == "Running" and env.status(name)["workers"]["ready"] == 1,
        60,
        "Running",
        name,
    )
    names = sorted(p["metadata"]["name"] for p in env.pods(name))
    assert names == [f"{name}-coordinator-0", f"{name}-worker-1"], names
    # Exactly one replica acted; the other (lower priority) stood by.
    acted = [op for op in ops if f"created Pod {name}-worker-1" in op.log_path.read_text(errors="replace")]
    assert len(acted) == 1, Both(ops).log_tail()
    (standby,) = [op for op in ops if op not in acted]
    assert "created Pod" not in standby.log_path.read_text(errors="replace"), Both(ops).log_tail()
