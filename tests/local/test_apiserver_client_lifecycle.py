"""The embedded API server against the official `kubernetes` Python client: object lifecycles. Graceful
deletion, eviction and disruption budgets, finalizers, garbage collection, namespace deletion, pod logs, event
expiry, and nodes whose kubelet stopped reporting."""

from __future__ import annotations

import os

import pytest
from apiserver_client_testlib import NS, pod_body
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.wait import wait_until


def bound_pod(core, name: str, **kw) -> None:
    core.create_namespaced_pod(NS, pod_body(name, **kw))
    core.create_namespaced_binding(
        NS, {"metadata": {"name": name}, "target": {"kind": "Node", "name": "n1"}}, _preload_content=False
    )


def test_graceful_pod_deletion(api):
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(NS, pod_body("unbound"))
    core.delete_namespaced_pod("unbound", NS)
    assert not core.list_namespaced_pod(NS).items  # never scheduled: gone at once

    bound_pod(core, "bound", terminationGracePeriodSeconds=20)
    assert core.read_namespaced_pod("bound", NS).spec.node_name == "n1"
    core.delete_namespaced_pod("bound", NS)
    pod = core.read_namespaced_pod("bound", NS)
    assert pod.metadata.deletion_timestamp is not None and pod.metadata.deletion_grace_period_seconds == 20
    core.delete_namespaced_pod("bound", NS, grace_period_seconds=0)  # what the kubelet does when it is done
    assert not core.list_namespaced_pod(NS).items


def test_eviction_marks_disruption_target_and_respects_pdb(api):
    core = client.CoreV1Api(api)
    policy = client.PolicyV1Api(api)
    for n in ("e1", "e2"):
        bound_pod(core, n, labels={"app": "e"})
        core.patch_namespaced_pod_status(
            n, NS, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        )
    policy.create_namespaced_pod_disruption_budget(
        NS,
        {"metadata": {"name": "pdb"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "e"}}}},
    )
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "e1", "namespace": NS}}
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod_eviction("e1", NS, eviction)
    assert e.value.status == 429
    policy.delete_namespaced_pod_disruption_budget("pdb", NS)
    core.create_namespaced_pod_eviction("e1", NS, eviction)
    pod = core.read_namespaced_pod("e1", NS)
    assert pod.metadata.deletion_timestamp is not None
    cond = next(c for c in pod.status.conditions if c.type == "DisruptionTarget")
    assert cond.reason == "EvictionByEvictionAPI"


def test_finalizers_hold_deletion(api):
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "f", "finalizers": ["test/hold"]}})
    core.delete_namespaced_config_map("f", NS)
    held = core.read_namespaced_config_map("f", NS)
    assert held.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as e:
        core.patch_namespaced_config_map("f", NS, {"metadata": {"finalizers": ["test/hold", "test/more"]}})
    assert e.value.status == 403
    core.patch_namespaced_config_map("f", NS, [{"op": "remove", "path": "/metadata/finalizers"}])
    assert not core.list_namespaced_config_map(NS).items


def owned(name: str, owner) -> dict:
    return {
        "metadata": {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": owner.metadata.name,
                    "uid": owner.metadata.uid,
                    "blockOwnerDeletion": True,
                }
            ],
        }
    }


def test_garbage_collection_background_foreground_orphan(api):
    core = client.CoreV1Api(api)
    names = lambda: sorted(c.metadata.name for c in core.list_namespaced_config_map(NS).items)  # noqa: E731
    owner = core.create_namespaced_config_map(NS, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(NS, owned("dep", owner))
    core.delete_namespaced_config_map("owner", NS)  # background (default)
    assert names() == []

    owner = core.create_namespaced_config_map(NS, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(NS, owned("dep", owner))
    core.delete_namespaced_config_map("owner", NS, propagation_policy="Orphan")
    assert names() == ["dep"] and not core.read_namespaced_config_map("dep", NS).metadata.owner_references
    core.delete_namespaced_config_map("dep", NS)

    # Foreground: the owner waits (deletionTimestamp + foregroundDeletion) until its dependents are gone.
    owner = core.create_namespaced_config_map(NS, {"metadata": {"name": "owner"}})
    pod = pod_body("dep-pod")
    pod["metadata"].update(owned("dep-pod", owner)["metadata"])
    core.create_namespaced_pod(NS, pod)
    core.create_namespaced_binding(
        NS,
        {"metadata": {"name": "dep-pod"}, "target": {"kind": "Node", "name": "n1"}},
        _preload_content=False,
    )
    core.delete_namespaced_config_map("owner", NS, propagation_policy="Foreground")
    waiting = core.read_namespaced_config_map("owner", NS)
    assert "foregroundDeletion" in waiting.metadata.finalizers and waiting.metadata.deletion_timestamp
    assert core.read_namespaced_pod("dep-pod", NS).metadata.deletion_timestamp is not None
    core.delete_namespaced_pod("dep-pod", NS, grace_period_seconds=0)
    assert names() == []


def test_namespace_deletion_removes_contents(api):
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "tmp"}})
    core.create_namespaced_config_map("tmp", {"metadata": {"name": "c"}})
    core.delete_namespace("tmp")
    wait_until(
        lambda: "tmp" not in {n.metadata.name for n in core.list_namespace().items},
        10,
        "namespace gone",
        interval=0.02,
    )
    with pytest.raises(ApiException):
        core.read_namespaced_config_map("c", "tmp")


def test_pod_logs_read_and_follow(server, api):
    core = client.CoreV1Api(api)
    bound_pod(core, "logger")
    log_dir = server.server.logs_dir(NS, "logger")
    os.makedirs(log_dir)
    path = os.path.join(log_dir, "main.log")
    with open(path, "w") as f:
        f.write("one\ntwo\nthree\n")
    assert core.read_namespaced_pod_log("logger", NS) == "one\ntwo\nthree\n"
    assert core.read_namespaced_pod_log("logger", NS, tail_lines=1) == "three\n"

    resp = core.read_namespaced_pod_log("logger", NS, follow=True, _preload_content=False)
    with open(path, "a") as f:
        f.write("four\n")
    core.patch_namespaced_pod_status("logger", NS, {"status": {"phase": "Succeeded"}})
    assert resp.data.decode() == "one\ntwo\nthree\nfour\n"  # the stream ends when the container has ended


def test_events_expire_after_the_event_ttl(server, api):
    import datetime as dt

    core = client.CoreV1Api(api)
    ref = {"kind": "Pod", "name": "p", "namespace": NS}
    core.create_namespaced_event(
        NS,
        {
            "metadata": {"name": "old"},
            "involvedObject": ref,
            "reason": "R",
            "lastTimestamp": "2020-01-01T00:00:00Z",
        },
    )
    core.create_namespaced_event(NS, {"metadata": {"name": "new"}, "involvedObject": ref, "reason": "R"})
    assert server.call(server.server.expire_events, dt.datetime.now(dt.timezone.utc)) == 1
    assert [e.metadata.name for e in core.list_namespaced_event(NS).items] == ["new"]


def test_a_node_whose_kubelet_stopped_reporting_turns_ready_unknown(tmp_path):
    """The node lifecycle controller's first duty, driven by hand (a server whose housekeeping does not run)."""
    import datetime as dt

    from ftjob_local.apiserver import ApiServer
    from ftjob_local.apiserver.resources import NODE_KEY

    server = ApiServer(str(tmp_path / "state"))
    rt = server.registry.types[NODE_KEY]
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def post_status(name: str, beat: str | None) -> None:
        conds = [
            {"type": t, "status": s, "reason": "Kubelet", **({"lastHeartbeatTime": beat} if beat else {})}
            for t, s in (("MemoryPressure", "False"), ("Ready", "True"))
        ]
        body = {"status": {"conditions": conds}}
        server.objects.patch(rt, "v1", "", name, body, "application/merge-patch+json", {}, sub="status")

    def conditions(name: str) -> dict[str, tuple[str, str]]:
        conds = server.objects.get(rt, "", name)["status"]["conditions"]
        return {c["type"]: (c["status"], c["reason"]) for c in conds}

    for name in ("quiet", "alive", "by-hand"):
        server.objects.create(rt, "v1", "", {"metadata": {"name": name}}, {})
        post_status(name, None if name == "by-hand" else "2020-01-01T00:00:00Z")
    # Heartbeats are timed from when the server saw them (an old timestamp, a server just started: no verdict).
    assert server.mark_silent_nodes(t0) == []
    post_status("alive", "2020-01-01T00:00:30Z")
    assert server.mark_silent_nodes(t0 + dt.timedelta(seconds=30)) == []
    assert server.mark_silent_nodes(t0 + dt.timedelta(seconds=41)) == ["quiet"]
    assert conditions("quiet") == {
        "Ready": ("Unknown", "NodeStatusUnknown"),
        "MemoryPressure": ("Unknown", "NodeStatusUnknown"),
    }
    ready = next(
        c for c in server.objects.get(rt, "", "quiet")["status"]["conditions"] if c["type"] == "Ready"
    )
    assert ready["message"] == "Kubelet stopped posting node status."
    assert conditions("alive") == {"Ready": ("True", "Kubelet"), "MemoryPressure": ("False", "Kubelet")}
    # Marked once; a node nothing posts heartbeats for is not a kubelet's and is left alone.
    assert server.mark_silent_nodes(t0 + dt.timedelta(seconds=71)) == ["alive"]
    assert server.mark_silent_nodes(t0 + dt.timedelta(seconds=999)) == []
    assert conditions("by-hand")["Ready"] == ("True", "Kubelet")
    # The kubelet is back: its heartbeat sets Ready again, and the clock starts over.
    post_status("quiet", "2020-01-01T00:05:00Z")
    assert server.mark_silent_nodes(t0 + dt.timedelta(seconds=1000)) == []
    assert server.mark_silent_nodes(t0 + dt.timedelta(seconds=1041)) == ["quiet"]
    server.store.close()
