"""The local scheduler's queues against the in-process API server (issue 15): a new pod is tried at once and alone,
whatever else the cluster holds; a pod that fits nowhere is reported Unschedulable (condition and
FailedScheduling event) once and waits, untouched by heartbeats and by unrelated pods; the events that can make it
fit (a placed pod deleted, a node's labels changed) bring it back and it is bound. Counted, not timed."""

from __future__ import annotations

import json

import pytest
from ftjob_local.apiserver import start_in_thread
from ftjob_local.client import Informer, Kube
from ftjob_local.objects import condition, pod_path
from ftjob_local.scheduler import Scheduler
from support.wait import wait_until

NS = "default"
HOST = "kubernetes.io/hostname"
OTHER_JOBS = 150  # each with a placed pod and a pod that waits for a node no one has


def make_node(kube: Kube, name: str) -> None:
    kube.request("POST", "/api/v1/nodes", body={"metadata": {"name": name, "labels": {HOST: name}}})
    status = {
        "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "1000"},
        "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
    }
    kube.merge_patch(f"/api/v1/nodes/{name}/status", {"status": status})


def make_pod(kube: Kube, name: str, labels: dict, node: str | None = None, **spec) -> None:
    body = {
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}], **({"nodeName": node} if node else {}), **spec},
    }
    kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)


def node_of(kube: Kube, name: str) -> str | None:
    return ((kube.get(pod_path(NS, name)) or {}).get("spec") or {}).get("nodeName")


def alone(group: str) -> dict:
    """Required anti-affinity against the pods of `group` on the same host."""
    term = {"labelSelector": {"matchLabels": {"group": group}}, "topologyKey": HOST}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


@pytest.fixture
def world(tmp_path):
    server = start_in_thread(str(tmp_path / "state"))
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "l", "cluster": {"server": server.url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "l", "context": {"cluster": "l", "user": "u"}}],
                "current-context": "l",
            }
        )
    )
    kube = Kube(str(config))
    for name in ("n0", "n1"):
        make_node(kube, name)
    for i in range(OTHER_JOBS):
        make_pod(
            kube, f"j{i}-placed", {"job": f"j{i}", "group": f"j{i}"}, f"n{i % 2}", affinity=alone(f"j{i}")
        )
        make_pod(kube, f"j{i}-waiting", {"job": f"j{i}"}, nodeSelector={"pool": "none"})
    pods, nodes = Informer(kube, "/api/v1/pods", "pods"), Informer(kube, "/api/v1/nodes", "nodes")
    scheduler = Scheduler(kube, pods, nodes)
    for inf in (pods, nodes):
        inf.start()
    scheduler.start()
    try:
        wait_until(lambda: scheduler.attempts >= OTHER_JOBS, 60, "every waiting pod to be tried")
        wait_until(
            lambda: all(
                condition(p, "PodScheduled")
                for p in pods.items()
                if p["metadata"]["name"].endswith("-waiting")
            ),
            60,
            "every waiting pod to be reported Unschedulable",
        )
        yield kube, scheduler
    finally:
        scheduler.stop()
        for inf in (pods, nodes):
            inf.stop()
        server.stop()


def test_a_new_pod_is_tried_alone_and_a_heartbeat_retries_nothing(world):
    kube, scheduler = world
    assert scheduler.attempts == OTHER_JOBS  # each waiting pod once: its own Unschedulable patch is no reason
    beat = "2026-01-01T00:00:05Z"
    kube.merge_patch(
        "/api/v1/nodes/n0/status",
        {"status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": beat}]}},
    )
    wait_until(
        lambda: scheduler.placed.nodes["n0"]["status"]["conditions"][0]["lastHeartbeatTime"] == beat,
        20,
        "the scheduler to see the heartbeat",
    )
    visited = scheduler.placed.visited
    make_pod(kube, "mine-0", {"job": "mine", "group": "mine"}, affinity=alone("mine"))
    assert wait_until(lambda: node_of(kube, "mine-0"), 20, "mine-0 bound") in ("n0", "n1")
    assert scheduler.attempts == OTHER_JOBS + 1
    # its own anti-affinity term and the placed pods' terms that could select it: none of the other jobs' pods
    assert scheduler.placed.visited - visited == 0


def test_a_deleted_neighbour_and_a_node_label_bring_waiting_pods_back(world):
    kube, scheduler = world
    make_pod(kube, "solo-0", {"group": "solo"}, "n0")
    make_pod(kube, "solo-1", {"group": "solo"}, "n1")
    make_pod(kube, "solo-2", {"group": "solo"}, affinity=alone("solo"))
    waiting = wait_until(
        lambda: (lambda p: p if condition(p or {}, "PodScheduled") else None)(
            kube.get(pod_path(NS, "solo-2"))
        ),
        20,
        "solo-2 reported",
    )
    assert condition(waiting, "PodScheduled")["reason"] == "Unschedulable"
    assert condition(waiting, "PodScheduled")["message"] == (
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    )
    events = kube.get(f"/api/v1/namespaces/{NS}/events")["items"]
    assert [e["reason"] for e in events if e["involvedObject"]["name"] == "solo-2"] == ["FailedScheduling"]

    tried = scheduler.attempts
    kube.delete(pod_path(NS, "solo-1"), grace=0)
    assert wait_until(lambda: node_of(kube, "solo-2"), 20, "solo-2 bound") == "n1"
    # the deletion brought every waiting pod back once: the other jobs' too (none of them fit)
    wait_until(lambda: scheduler.attempts >= tried + 1 + OTHER_JOBS, 20, "the waiting pods' retries")
    assert scheduler.attempts == tried + 1 + OTHER_JOBS

    kube.merge_patch("/api/v1/nodes/n0", {"metadata": {"labels": {"pool": "none"}}})
    wait_until(lambda: all(node_of(kube, f"j{i}-waiting") == "n0" for i in range(OTHER_JOBS)), 60, "binds")


def test_a_pod_waiting_for_a_neighbour_is_tried_when_one_is_placed(world):
    kube, scheduler = world
    term = {"labelSelector": {"matchLabels": {"group": "late"}}, "topologyKey": HOST}
    near = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    make_pod(kube, "follower", {"group": "follower"}, affinity=near)
    waiting = wait_until(
        lambda: (lambda p: p if condition(p or {}, "PodScheduled") else None)(
            kube.get(pod_path(NS, "follower"))
        ),
        20,
        "follower reported",
    )
    assert condition(waiting, "PodScheduled")["message"] == (
        "0/2 nodes are available: 2 node(s) didn't match pod affinity rules."
    )
    make_pod(kube, "leader", {"group": "late"}, "n1")
    assert wait_until(lambda: node_of(kube, "follower"), 20, "follower bound") == "n1"
