"""Pure parts of the node agent: $(VAR) expansion, mount-path rewriting, scheduler filters, requests, endpoints."""

from __future__ import annotations

from decimal import Decimal

import pytest
from ftjob_local.kubelet import expand, rewrite_paths
from ftjob_local.netproxy import endpoints
from ftjob_local.objects import pod_requests, set_condition
from ftjob_local.scheduler import filter_node, tolerates


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("$(A)-$(B)", "x-y"),
        ("$(MISSING)", "$(MISSING)"),  # undefined references stay as written
        ("$$(A)", "$(A)"),  # $$ escapes
        ("cost $5", "cost $5"),
        ("$(A", "$(A"),  # unclosed
        ("--addr=$(A):29400", "--addr=x:29400"),
    ],
)
def test_expand_follows_kubernetes_rules(value, expected):
    assert expand(value, {"A": "x", "B": "y"}) == expected


def test_rewrite_paths_only_at_path_boundaries():
    mounts = [("/ckpt/sub", "/s/sub"), ("/ckpt", "/s/ckpt")]
    assert rewrite_paths("--dir=/ckpt/run1", mounts) == "--dir=/s/ckpt/run1"
    assert rewrite_paths("/ckpt/sub/x", mounts) == "/s/sub/x"
    assert rewrite_paths("/ckpt", mounts) == "/s/ckpt"
    assert rewrite_paths("/ckpts/other", mounts) == "/ckpts/other"  # a longer name is not the mount
    assert rewrite_paths("/data/ckpt", mounts) == "/data/ckpt"  # nor a path that merely contains it
    assert rewrite_paths("open('/ckpt/a', 'w')", mounts) == "open('/s/ckpt/a', 'w')"


def test_rewrite_paths_leaves_existing_host_paths_under_a_real_folder(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    mounts = [(str(tmp_path), "/vol")]
    assert rewrite_paths(f"{tmp_path}/bin/python", mounts) == f"{tmp_path}/bin/python"
    assert rewrite_paths(f"{tmp_path}/seed", mounts) == "/vol/seed"
    # One pass: a backing folder that starts with another mount path is not rewritten again.
    assert rewrite_paths("/a/x /b", [("/a", "/b/a"), ("/b", "/z")]) == "/b/a/x /z"


def node(name, labels=None, taints=None, cpu="2", memory="4Gi", gpu="0", pods="10", ready=True):
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpu, "pods": pods},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(requests=None, limits=None, selector=None, tolerations=None, init=None):
    spec = {"containers": [{"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}}]}
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": init}}]
    return {"metadata": {"name": "p"}, "spec": spec}


SPOT_TAINT = {"key": "aws-node-termination-handler/spot-itn", "value": "true", "effect": "NoSchedule"}


def test_filter_node_reasons():
    none = {"cpu": Decimal(0), "memory": Decimal(0), "nvidia.com/gpu": Decimal(0)}
    assert filter_node(pod(), node("n"), none, 0) is None
    assert "not ready" in filter_node(pod(), node("n", ready=False), none, 0)
    assert "selector" in filter_node(pod(selector={"ftjob.dev/spot": "true"}), node("n"), none, 0)
    assert (
        filter_node(pod(selector={"ftjob.dev/spot": "true"}), node("n", {"ftjob.dev/spot": "true"}), none, 0)
        is None
    )
    assert "untolerated taint" in filter_node(pod(), node("n", taints=[SPOT_TAINT]), none, 0)
    assert (
        filter_node(pod(tolerations=[{"operator": "Exists"}]), node("n", taints=[SPOT_TAINT]), none, 0)
        is None
    )
    assert filter_node(pod(requests={"cpu": "1500m"}), node("n"), none, 0) is None
    assert (
        filter_node(pod(requests={"cpu": "1500m"}), node("n"), {**none, "cpu": Decimal("0.6")}, 0)
        == "Insufficient cpu"
    )
    assert (
        filter_node(pod(limits={"nvidia.com/gpu": "1"}), node("n"), none, 0) == "Insufficient nvidia.com/gpu"
    )
    assert filter_node(pod(limits={"nvidia.com/gpu": "1"}), node("n", gpu="1"), none, 0) is None
    assert filter_node(pod(), node("n", pods="1"), none, 1) == "Too many pods"
    # PreferNoSchedule does not filter.
    soft = {**SPOT_TAINT, "effect": "PreferNoSchedule"}
    assert filter_node(pod(), node("n", taints=[soft]), none, 0) is None


def test_tolerations():
    assert tolerates([{"key": SPOT_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}], SPOT_TAINT)
    assert tolerates([{"key": SPOT_TAINT["key"], "value": "true"}], SPOT_TAINT)
    assert not tolerates([{"key": SPOT_TAINT["key"], "value": "false"}], SPOT_TAINT)
    assert not tolerates(
        [{"key": SPOT_TAINT["key"], "operator": "Exists", "effect": "NoExecute"}], SPOT_TAINT
    )
    assert not tolerates([], SPOT_TAINT)


def test_pod_requests_uses_limits_and_init_max():
    r = pod_requests(pod(requests={"cpu": "250m"}, limits={"memory": "1Gi"}, init={"cpu": "2"}))
    assert r["cpu"] == Decimal(2)
    assert r["memory"] == Decimal(1024**3)
    assert r["nvidia.com/gpu"] == 0


def test_set_condition_keeps_transition_time_when_status_unchanged():
    conds = set_condition([], "Ready", "False", "A")
    first = conds[0]["lastTransitionTime"]
    conds[0]["lastTransitionTime"] = "2000-01-01T00:00:00Z"
    again = set_condition(conds, "Ready", "False", "B")
    assert again[0]["lastTransitionTime"] == "2000-01-01T00:00:00Z" and again[0]["reason"] == "B"
    flipped = set_condition(again, "Ready", "True")
    assert flipped[0]["lastTransitionTime"] != "2000-01-01T00:00:00Z"
    assert first


def test_endpoints_select_ready_pods_and_named_ports():
    svc = {"metadata": {"name": "s", "namespace": "ns"}, "spec": {"selector": {"app": "a"}}}

    def p(ip, ready, labels, ns="ns"):
        return {
            "metadata": {"name": ip, "namespace": ns, "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }

    pods = [
        p("127.10.0.2", True, {"app": "a"}),
        p("127.10.0.3", False, {"app": "a"}),
        p("127.10.0.4", True, {"app": "b"}),
        p("127.10.0.5", True, {"app": "a"}, ns="other"),
    ]
    assert endpoints(svc, {"port": 80, "targetPort": "http"}, pods) == [("127.10.0.2", 8080)]
    assert endpoints(svc, {"port": 80}, pods) == [("127.10.0.2", 80)]


def test_agent_state_keeps_the_newest_handled_preemption_requests(tmp_path):
    import json
    import uuid

    from ftjob_local.node.agent import NodeAgent

    # only the persistence half: no API server needed
    agent = NodeAgent.__new__(NodeAgent)
    agent.dir, agent.served, agent.next_index = tmp_path, {"local-spot-0"}, {"node": 1, "spot": 1}
    agent.handled = {}
    ids = [uuid.uuid4().hex for _ in range(250)]  # random ids: their sort order is not their age
    for rid in ids:
        agent.handled[rid] = None
    agent._save_state()
    assert json.loads((tmp_path / "state.json").read_text())["handled"] == ids[-200:]


@pytest.mark.slow
def test_a_containers_orphans_in_sessions_of_their_own_are_killed_by_its_marker(tmp_path):
    """torchrun's workers run in sessions of their own; if torchrun dies first they are reparented, out of reach of
    its process group and of a walk down from its pid. The container's marker still finds them."""
    import os
    import signal
    import subprocess
    import time
    import uuid

    from ftjob_local.procs import MARKER_ENV, kill_recorded, marked

    marker = f"test-uid/main/{uuid.uuid4().hex[:8]}"
    orphan_file = tmp_path / "orphan"
    p = subprocess.Popen(
        ["sh", "-c", f"setsid sleep 300 & echo $! > {orphan_file}"],
        env={**os.environ, MARKER_ENV: marker},
        start_new_session=True,
    )
    orphan = None
    try:
        assert p.wait(timeout=10) == 0  # the "main process" is gone, its child lives on in its own session
        orphan = int(orphan_file.read_text())
        deadline = time.monotonic() + 10
        while os.getsid(orphan) != orphan and time.monotonic() < deadline:  # setsid() may not have run yet
            time.sleep(0.01)
        assert os.getsid(orphan) == orphan and marked(marker) == [orphan]
        pid_file = tmp_path / "pid"
        pid_file.write_text(f"{p.pid} not-running {marker}")  # what the kubelet recorded for the container
        assert kill_recorded(pid_file)
        deadline = time.monotonic() + 10
        while marked(marker) and time.monotonic() < deadline:  # a killed process shows an empty environ
            time.sleep(0.05)
        assert marked(marker) == [], "the orphan survived"
    finally:
        if orphan is not None and marked(marker):
            os.kill(orphan, signal.SIGKILL)
