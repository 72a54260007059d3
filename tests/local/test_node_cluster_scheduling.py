"""The node agent against the real local API server: node registration, scheduling (selectors, taints,
resources, anti-affinity), deleting a node, and running pods across an API server restart.

One cluster (API server + node agent, no operator) is started for the module with `LocalCluster.up`, as
`ftjob local up --no-operator` does, and stopped at the end.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from node_cluster_testlib import PY, cond, events_for, get_pod, kubectl, make_pod, name, phase_is
from support.wait import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ftjob_local.apiserver.__main__") is None,
        reason="the local API server (ftjob_local.apiserver) is not in this build yet",
    ),
]


def test_nodes_registered_with_capacity_and_spot_label(kube):
    nodes = {n["metadata"]["name"]: n for n in kube.request("GET", "/api/v1/nodes")["items"]}
    assert {"local-node-0", "local-spot-0"} <= set(nodes)
    spot = nodes["local-spot-0"]
    assert spot["metadata"]["labels"]["ftjob.dev/spot"] == "true"
    assert "ftjob.dev/spot" not in nodes["local-node-0"]["metadata"]["labels"]
    assert cond(spot, "Ready")["status"] == "True"
    assert set(spot["status"]["capacity"]) >= {"cpu", "memory", "pods", "nvidia.com/gpu"}


def test_scheduling_selectors_taints_and_resources(kube, cluster):
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    spot = name("spot")
    make_pod(kube, spot, sleep, nodeSelector={"ftjob.dev/spot": "true"}, terminationGracePeriodSeconds=0)
    big = name("big")
    make_pod(kube, big, sleep, container={"resources": {"requests": {"cpu": "1000"}}})
    gpu = name("gpu")
    make_pod(kube, gpu, sleep, container={"resources": {"limits": {"nvidia.com/gpu": "1"}}})
    pod = wait_until(
        lambda: (get_pod(kube, spot) or {}).get("spec", {}).get("nodeName"), 20, what="spot binding"
    )
    assert pod == "local-spot-0"
    for pending, why in ((big, "Insufficient cpu"), (gpu, "Insufficient nvidia.com/gpu")):
        p = wait_until(
            lambda n=pending: (lambda x: x if cond(x, "PodScheduled").get("status") == "False" else None)(
                get_pod(kube, n)
            ),
            20,
            what=f"{pending} unschedulable",
        )
        assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
        assert cond(p, "PodScheduled")["reason"] == "Unschedulable"
        assert why in cond(p, "PodScheduled")["message"]
        ev = wait_until(
            lambda n=pending: [e for e in events_for(kube, n) if e["reason"] == "FailedScheduling"],
            10,
            what="FailedScheduling event",
        )
        assert why in ev[0]["message"] and ev[0]["type"] == "Warning"

    # A NoSchedule taint keeps pods without a toleration away; a toleration lets them in.
    kubectl(cluster, "taint", "node", "local-node-0", "example.com/maintenance=yes:NoSchedule")
    try:
        pinned = {"kubernetes.io/hostname": "local-node-0"}
        refused, tolerant = name("refused"), name("tolerant")
        make_pod(kube, refused, sleep, nodeSelector=pinned)
        make_pod(
            kube,
            tolerant,
            sleep,
            nodeSelector=pinned,
            terminationGracePeriodSeconds=0,
            tolerations=[{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}],
        )
        assert (
            wait_until(
                lambda: (get_pod(kube, tolerant) or {}).get("spec", {}).get("nodeName"),
                20,
                what="tolerant binding",
            )
            == "local-node-0"
        )
        p = wait_until(
            lambda: (lambda x: x if cond(x, "PodScheduled").get("status") == "False" else None)(
                get_pod(kube, refused)
            ),
            20,
            what="refused unschedulable",
        )
        assert "untolerated taint {example.com/maintenance: yes}" in cond(p, "PodScheduled")["message"]
    finally:
        kubectl(cluster, "taint", "node", "local-node-0", "example.com/maintenance-")
    # Once the taint is gone the pending pod is scheduled.
    assert (
        wait_until(
            lambda: (get_pod(kube, refused) or {}).get("spec", {}).get("nodeName"),
            20,
            what="binding after untaint",
        )
        == "local-node-0"
    )
    for n in (spot, big, gpu, refused, tolerant):
        kubectl(cluster, "delete", "pod", n, "--grace-period=0", "--force", "--wait=false", check=False)


def test_required_anti_affinity_waits_for_a_free_node_and_takes_it_when_one_comes(kube, cluster):
    """The worker pods' spread as the operator renders it: the second pod does not share the one spot node; it
    waits Unschedulable and is bound as soon as a node change gives it somewhere to go."""
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    group = {"app": name("spread")}
    term = {"labelSelector": {"matchLabels": group}, "topologyKey": "kubernetes.io/hostname"}
    spec = {
        "labels": group,
        "nodeSelector": {"ftjob.dev/spot": "true"},
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
        "terminationGracePeriodSeconds": 0,
    }
    first, second = name("first"), name("second")
    make_pod(kube, first, sleep, **spec)
    where = wait_until(
        lambda: (get_pod(kube, first) or {}).get("spec", {}).get("nodeName"), 20, "first binding"
    )
    assert where == "local-spot-0"
    make_pod(kube, second, sleep, **spec)
    try:
        p = wait_until(
            lambda: (lambda x: x if cond(x, "PodScheduled").get("status") == "False" else None)(
                get_pod(kube, second)
            ),
            20,
            what="second unschedulable",
        )
        assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
        assert cond(p, "PodScheduled")["reason"] == "Unschedulable"
        assert cond(p, "PodScheduled")["message"] == (
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
            "1 node(s) didn't match pod anti-affinity rules."
        )
        kubectl(cluster, "label", "node", "local-node-0", "ftjob.dev/spot=true")
        where = wait_until(
            lambda: (get_pod(kube, second) or {}).get("spec", {}).get("nodeName"), 20, "second binding"
        )
        assert where == "local-node-0"
    finally:
        kubectl(cluster, "label", "node", "local-node-0", "ftjob.dev/spot-", check=False)
        for n in (first, second):
            kubectl(cluster, "delete", "pod", n, "--grace-period=0", "--force", "--wait=false", check=False)


def test_node_deletion_kills_its_pods(kube, cluster, tmp_path):
    """Pod GC: deleting a node kills its pods' processes and deletes the pods (the node is re-registered)."""
    pod_name = name("orphan")
    created = make_pod(
        kube,
        pod_name,
        [PY, "-c", "import time; time.sleep(120)"],
        nodeSelector={"kubernetes.io/hostname": "local-node-0"},
    )
    wait_until(phase_is(kube, pod_name, "Running"), 30, what="pod running")
    pid_file = cluster.dir / "pods" / created["metadata"]["uid"] / "containers" / "main" / "pid"
    pid = int(pid_file.read_text().split()[0])
    kubectl(cluster, "delete", "node", "local-node-0")
    wait_until(lambda: get_pod(kube, pod_name) is None, 20, what="pod deleted with its node")

    def dead():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(dead, 10, what="process killed")


def test_pods_keep_running_across_an_api_server_restart(kube, cluster, tmp_path):
    """The node agent re-lists after the control plane comes back: running pods continue, new pods run."""
    marker = tmp_path / "ticks"
    pod_name = name("steady")
    # The pod writes each tick to a side file and renames it over the marker, so a read never sees the
    # marker truncated and empty (write_text truncates first: CI read '' once).
    code = (
        f"import os, time, pathlib\nn = 0\nwhile True:\n    n += 1; pathlib.Path({str(marker)!r} + '.tmp').write_text(str(n));"
        f" os.replace({str(marker)!r} + '.tmp', {str(marker)!r}); time.sleep(0.1)"
    )
    created = make_pod(
        kube,
        pod_name,
        [PY, "-c", code],
        terminationGracePeriodSeconds=1,
        nodeSelector={"kubernetes.io/hostname": "local-spot-0"},
    )
    wait_until(phase_is(kube, pod_name, "Running"), 30, what="pod running")
    pid_file = cluster.dir / "pods" / created["metadata"]["uid"] / "containers" / "main" / "pid"
    pid = int(pid_file.read_text().split()[0])
    cluster.down(only=["apiserver"], say=lambda *_: None)
    tick = int(marker.read_text())
    wait_until(
        lambda: int(marker.read_text()) > tick + 3, 10, what="the pod to go on while the API server is down"
    )
    cluster.restart("apiserver")
    os.kill(pid, 0)  # the process was never touched
    assert get_pod(kube, pod_name)["status"]["phase"] == "Running"
    after = name("after")
    make_pod(kube, after, [PY, "-c", "print('after restart')"])
    wait_until(phase_is(kube, after, "Succeeded"), 30, what="a new pod after the restart")
    kubectl(cluster, "delete", "pod", pod_name, "--wait=true", "--timeout=30s")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
