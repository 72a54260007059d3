"""The embedded API server against the official `kubernetes` Python client: CRUD, watch, conflicts, the three
patch types, graceful deletion, finalizers, garbage collection, subresources, custom resources, persistence."""

from __future__ import annotations

import copy
import os
import threading
import time

import pytest
from ftjob_local.apiserver import start_in_thread
from ftjob_local.apiserver import watch as watch_mod
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from support.wait import wait_until

NS = "default"

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.ftjob.dev"},
    "spec": {
        "group": "test.ftjob.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"},
                },
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["image"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minReplicas <= self.replicas",
                                        "message": "minReplicas must not exceed replicas",
                                    }
                                ],
                                "properties": {
                                    "image": {"type": "string", "minLength": 1},
                                    "replicas": {
                                        "type": "integer",
                                        "minimum": 0,
                                        "maximum": 10,
                                        "default": 1,
                                    },
                                    "minReplicas": {"type": "integer", "minimum": 0, "default": 0},
                                    "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {"replicas": {"type": "integer"}, "phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture()
def server(tmp_path):
    handle = start_in_thread(str(tmp_path / "state"))
    try:
        yield handle
    finally:
        handle.stop()


def api_client(url: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url
    return client.ApiClient(cfg)


@pytest.fixture()
def api(server):
    with api_client(server.url) as c:
        yield c


def pod_body(name: str, labels: dict | None = None, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "python:3.12", "command": ["true"]}], **spec},
    }


def status_of(exc: ApiException) -> tuple[int, str]:
    import json

    return exc.status, json.loads(exc.body)["reason"]


def test_starts_with_default_namespaces_and_service_accounts(api):
    core = client.CoreV1Api(api)
    names = {n.metadata.name for n in core.list_namespace().items}
    assert {"default", "kube-system"} <= names
    assert core.read_namespaced_service_account("default", "kube-system").metadata.name == "default"


def test_pod_crud_selectors_conflict_and_errors(api):
    core = client.CoreV1Api(api)
    created = core.create_namespaced_pod(NS, pod_body("a", {"app": "x", "tier": "web"}))
    assert created.metadata.uid and created.metadata.generation == 1 and created.status.phase == "Pending"
    core.create_namespaced_pod(NS, pod_body("b", {"app": "y"}))
    core.create_namespaced_pod(NS, pod_body("c", {"app": "z"}, nodeName="n1"))
    names = lambda **kw: sorted(p.metadata.name for p in core.list_namespaced_pod(NS, **kw).items)  # noqa: E731
    assert names(label_selector="app=x") == ["a"]
    assert names(label_selector="app!=x") == ["b", "c"]
    assert names(label_selector="app in (x,y)") == ["a", "b"]
    assert names(label_selector="app notin (x,y)") == ["c"]
    assert names(label_selector="tier") == ["a"]
    assert names(label_selector="!tier") == ["b", "c"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="spec.nodeName=n1") == ["c"]
    assert names(field_selector="status.phase=Pending,metadata.name!=a") == ["b", "c"]

    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(NS, pod_body("a"))
    assert status_of(e.value) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod("nope", NS)
    assert status_of(e.value) == (404, "NotFound")
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod("no-such-ns", pod_body("a"))
    assert status_of(e.value) == (404, "NotFound")

    stale = core.read_namespaced_pod("a", NS)
    fresh = copy.deepcopy(stale)
    fresh.metadata.labels["v"] = "2"
    updated = core.replace_namespaced_pod("a", NS, fresh)
    assert int(updated.metadata.resource_version) > int(stale.metadata.resource_version)
    stale.metadata.labels["v"] = "3"
    with pytest.raises(ApiException) as e:
        core.replace_namespaced_pod("a", NS, stale)
    assert status_of(e.value) == (409, "Conflict")
    assert "the object has been modified" in e.value.body

    generated = core.create_namespaced_config_map(
        NS, {"metadata": {"generateName": "gen-"}, "data": {"k": "v"}}
    )
    assert generated.metadata.name.startswith("gen-") and len(generated.metadata.name) == 9


def test_invalid_objects_are_refused_with_causes(api):
    import json

    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(
            NS, {"metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "m"}]}}
        )
    body = json.loads(e.value.body)
    assert e.value.status == 422 and body["reason"] == "Invalid"
    fields = {c["field"] for c in body["details"]["causes"]}
    assert fields == {"metadata.name", "spec.containers[0].image"}
    assert core.list_namespaced_pod(NS).items == []
    with pytest.raises(ApiException) as e:
        core.create_namespaced_config_map(
            NS, {"metadata": {"name": "c", "labels": {"a": "x" * 64, "b/c/d": "1"}}}
        )
    causes = json.loads(e.value.body)["details"]["causes"]
    assert [c["field"] for c in causes] == ["metadata.labels", "metadata.labels"]
    assert "must be no more than 63 characters" in causes[0]["message"]


def test_patch_types(api):
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(NS, pod_body("p", {"a": "1"}))
    # strategic merge: containers merge by name (the image is the one container field a pod may change)
    core.patch_namespaced_pod("p", NS, {"spec": {"containers": [{"name": "main", "image": "python:3.13"}]}})
    pod = core.read_namespaced_pod("p", NS)
    assert pod.spec.containers[0].image == "python:3.13" and pod.spec.containers[0].command == ["true"]
    with pytest.raises(ApiException) as e:
        core.patch_namespaced_pod(
            "p", NS, {"spec": {"containers": [{"name": "main", "env": [{"name": "X"}]}]}}
        )
    assert status_of(e.value) == (422, "Invalid") and "pod updates may not change fields" in e.value.body
    # JSON merge patch: null removes
    core.patch_namespaced_pod(
        "p", NS, {"metadata": {"labels": {"a": None, "b": "2"}}}, _content_type="application/merge-patch+json"
    )
    assert core.read_namespaced_pod("p", NS).metadata.labels == {"b": "2"}
    # JSON patch (the client picks json-patch for a list body)
    core.patch_namespaced_pod("p", NS, [{"op": "add", "path": "/metadata/annotations", "value": {"n": "1"}}])
    assert core.read_namespaced_pod("p", NS).metadata.annotations == {"n": "1"}
    with pytest.raises(ApiException) as e:
        core.patch_namespaced_pod("p", NS, [{"op": "test", "path": "/metadata/name", "value": "other"}])
    assert e.value.status == 422


def test_watch_from_resource_version_selectors_and_bookmarks(api, monkeypatch):
    monkeypatch.setattr(watch_mod, "BOOKMARK_EVERY_S", 0.2)
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "before", "labels": {"w": "1"}}})
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def run():
        for ev in w.stream(
            core.list_namespaced_config_map,
            NS,
            label_selector="w=1",
            resource_version=rv,
            timeout_seconds=10,
            allow_watch_bookmarks=True,
        ):
            if ev["type"] == "BOOKMARK":
                seen.append(("BOOKMARK", ""))
                continue
            seen.append((ev["type"], ev["object"].metadata.name))
            if seen.count(("DELETED", "m")) == 2:  # the second: the real deletion
                w.stop()

    t = threading.Thread(target=run)
    t.start()
    try:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "m", "labels": {"w": "1"}}})
        core.create_namespaced_config_map(NS, {"metadata": {"name": "other"}})
        core.patch_namespaced_config_map("m", NS, {"data": {"k": "v"}})
        core.patch_namespaced_config_map("m", NS, {"metadata": {"labels": {"w": "2"}}})  # leaves the selector
        core.patch_namespaced_config_map("m", NS, {"metadata": {"labels": {"w": "1"}}})  # comes back
        wait_until(lambda: ("BOOKMARK", "") in seen, 10, "a bookmark", interval=0.02)
        core.delete_namespaced_config_map("m", NS)
    finally:
        t.join(timeout=15)
    events = [e for e in seen if e[0] != "BOOKMARK"]
    assert events == [("ADDED", "m"), ("MODIFIED", "m"), ("DELETED", "m"), ("ADDED", "m"), ("DELETED", "m")]


def test_watch_without_resource_version_lists_existing_first(api):
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "x1"}})
    w = watch.Watch()
    for ev in w.stream(core.list_namespaced_config_map, NS, timeout_seconds=5):
        assert (ev["type"], ev["object"].metadata.name) == ("ADDED", "x1")
        w.stop()


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


def test_services_get_cluster_ips_from_the_local_range(api):
    core = client.CoreV1Api(api)
    ips = set()
    for n in ("s1", "s2"):
        svc = core.create_namespaced_service(
            NS, {"metadata": {"name": n}, "spec": {"ports": [{"port": 29400}]}}
        )
        assert svc.spec.cluster_ip.startswith("127.96.") and svc.spec.ports[0].target_port == 29400
        ips.add(svc.spec.cluster_ip)
    assert len(ips) == 2
    updated = core.patch_namespaced_service("s1", NS, {"metadata": {"labels": {"x": "y"}}})
    assert updated.spec.cluster_ip in ips


def test_secrets_string_data(api):
    core = client.CoreV1Api(api)
    s = core.create_namespaced_secret(NS, {"metadata": {"name": "s"}, "stringData": {"token": "abc"}})
    assert s.data == {"token": "YWJj"} and s.type == "Opaque"


def test_custom_resources_schema_status_scale_and_generation(api):
    ext = client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition(WIDGET_CRD)
    crd = ext.read_custom_resource_definition("widgets.test.ftjob.dev")
    assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"
    co = client.CustomObjectsApi(api)
    args = ("test.ftjob.dev", "v1", NS, "widgets")
    w = co.create_namespaced_custom_object(
        *args,
        {
            "apiVersion": "test.ftjob.dev/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"image": "i", "extra": 1},
            "status": {"phase": "ignored"},
        },
    )
    assert w["spec"] == {"image": "i", "replicas": 1, "minReplicas": 0, "mode": "fast"}  # pruned + defaulted
    assert "status" not in w and w["metadata"]["generation"] == 1
    with pytest.raises(ApiException) as e:
        co.create_namespaced_custom_object(
            *args,
            {
                "apiVersion": "test.ftjob.dev/v1",
                "kind": "Widget",
                "metadata": {"name": "bad"},
                "spec": {"replicas": 3, "minReplicas": 5},
            },
        )
    assert e.value.status == 422
    assert (
        "spec.image: Required value" in e.value.body
        and "minReplicas must not exceed replicas" in e.value.body
    )

    s = co.patch_namespaced_custom_object_status(*args, "w", {"status": {"phase": "Running", "replicas": 1}})
    assert s["status"]["phase"] == "Running" and s["metadata"]["generation"] == 1
    w = co.patch_namespaced_custom_object(
        *args, "w", {"status": {"phase": "ignored"}, "spec": {"mode": "slow"}}
    )
    assert w["status"]["phase"] == "Running" and w["metadata"]["generation"] == 2

    scale = co.get_namespaced_custom_object_scale(*args, "w")
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1 and scale["status"]["replicas"] == 1
    co.patch_namespaced_custom_object_scale(*args, "w", {"spec": {"replicas": 4}})
    w = co.get_namespaced_custom_object(*args, "w")
    assert w["spec"]["replicas"] == 4 and w["metadata"]["generation"] == 3

    # Deleting the CRD removes its objects and stops serving them.
    ext.delete_custom_resource_definition("widgets.test.ftjob.dev")
    with pytest.raises(ApiException) as e:
        co.list_namespaced_custom_object(*args)
    assert e.value.status == 404


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


def test_state_survives_restart_and_old_watch_gets_410(tmp_path):
    state = str(tmp_path / "state")
    first = start_in_thread(state)
    try:
        with api_client(first.url) as c:
            core = client.CoreV1Api(c)
            client.ApiextensionsV1Api(c).create_custom_resource_definition(WIDGET_CRD)
            client.CustomObjectsApi(c).create_namespaced_custom_object(
                "test.ftjob.dev",
                "v1",
                NS,
                "widgets",
                {
                    "apiVersion": "test.ftjob.dev/v1",
                    "kind": "Widget",
                    "metadata": {"name": "keep"},
                    "spec": {"image": "i"},
                },
            )
            cm = core.create_namespaced_config_map(NS, {"metadata": {"name": "keep"}, "data": {"a": "b"}})
            old_rv = cm.metadata.resource_version
            core.patch_namespaced_config_map("keep", NS, {"data": {"a": "c"}})
    finally:
        first.stop()
    second = start_in_thread(state)
    with pytest.raises(RuntimeError, match="already using the state dir"):
        start_in_thread(state)  # one server per state dir
    try:
        with api_client(second.url) as c:
            core = client.CoreV1Api(c)
            kept = core.read_namespaced_config_map("keep", NS)
            assert kept.data == {"a": "c"} and int(kept.metadata.resource_version) > int(old_rv)
            w = client.CustomObjectsApi(c).get_namespaced_custom_object(
                "test.ftjob.dev", "v1", NS, "widgets", "keep"
            )
            assert w["spec"]["replicas"] == 1
            fresh = core.create_namespaced_config_map(NS, {"metadata": {"name": "new"}})
            assert int(fresh.metadata.resource_version) > int(kept.metadata.resource_version)
            with pytest.raises(
                ApiException
            ) as e:  # history before the restart is gone: the client must relist
                for _ in watch.Watch().stream(
                    core.list_namespaced_config_map, NS, resource_version=old_rv, timeout_seconds=5
                ):
                    pass
            assert e.value.status == 410
    finally:
        second.stop()


def test_unknown_fields_warn_by_default_and_multiple_versions_share_storage(api):
    crd = copy.deepcopy(WIDGET_CRD)
    v2 = copy.deepcopy(crd["spec"]["versions"][0])
    v2.update(name="v2", storage=False)
    crd["spec"]["versions"].append(v2)
    client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    co = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "test.ftjob.dev/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"image": "i", "junk": 1},
    }
    _, status, headers = co.create_namespaced_custom_object_with_http_info(
        "test.ftjob.dev", "v1", NS, "widgets", body
    )
    assert status == 201 and 'unknown field \\"spec.junk\\"' in headers["Warning"]
    stored = co.get_namespaced_custom_object("test.ftjob.dev", "v2", NS, "widgets", "w")
    assert stored["apiVersion"] == "test.ftjob.dev/v2" and "junk" not in stored["spec"]
    assert "__warnings__" not in stored


def test_watch_ends_after_timeout_seconds_and_bad_requests_get_status_errors(server, api):
    import json
    import urllib.error
    import urllib.request

    core = client.CoreV1Api(api)
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    started = time.monotonic()
    events = list(
        watch.Watch().stream(
            core.list_namespaced_config_map, NS, resource_version=rv, timeout_seconds=1, _request_timeout=10
        )
    )
    assert events == [] and 0.9 <= time.monotonic() - started < 5

    def status(method: str, path: str, body: bytes | None = None) -> dict:
        req = urllib.request.Request(
            server.url + path, data=body, method=method, headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        return json.loads(e.value.read())

    s = status("PUT", "/api/v1/namespaces/default/configmaps", b"{}")
    assert (s["code"], s["reason"]) == (405, "MethodNotAllowed")
    s = status("POST", "/api/v1/namespaces/default/configmaps", b"{not json")
    assert (s["code"], s["reason"]) == (400, "BadRequest") and "not valid JSON" in s["message"]
    s = status("GET", "/apis/nothing.example/v1/things")
    assert (s["code"], s["reason"]) == (404, "NotFound")
    s = status("GET", "/api/v1/namespaces/default/configmaps?labelSelector=a%20b%20c")
    assert s["code"] == 400 and "unable to parse requirement" in s["message"]


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


def test_many_concurrent_watchers_each_see_every_event(server, api):
    import asyncio
    import json

    import aiohttp

    core = client.CoreV1Api(api)
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    n_watchers, n_objects = 40, 15

    async def watcher(session: aiohttp.ClientSession) -> list[str]:
        names = []
        url = f"{server.url}/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=20"
        async with session.get(url) as resp:
            async for line in resp.content:
                names.append(json.loads(line)["object"]["metadata"]["name"])
                if len(names) == n_objects:
                    break
        return names

    async def main() -> list[list[str]]:
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(watcher(session)) for _ in range(n_watchers)]
            await asyncio.sleep(
                0
            )  # the watches start; creating before they connect is fine too (history replay)
            await asyncio.to_thread(
                lambda: [
                    core.create_namespaced_config_map(NS, {"metadata": {"name": f"c{i}"}})
                    for i in range(n_objects)
                ]
            )
            return await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

    results = asyncio.run(main())
    assert all(r == [f"c{i}" for i in range(n_objects)] for r in results)


def test_server_side_dry_run_changes_nothing(api):
    core = client.CoreV1Api(api)
    dry = core.create_namespaced_config_map(
        NS, {"metadata": {"name": "dry"}, "data": {"a": "1"}}, dry_run="All"
    )
    assert dry.metadata.uid and not core.list_namespaced_config_map(NS).items
    core.create_namespaced_config_map(NS, {"metadata": {"name": "real"}, "data": {"a": "1"}})
    patched = core.patch_namespaced_config_map("real", NS, {"data": {"a": "2"}}, dry_run="All")
    assert patched.data == {"a": "2"} and core.read_namespaced_config_map("real", NS).data == {"a": "1"}
    core.delete_namespaced_config_map("real", NS, dry_run="All")
    assert core.read_namespaced_config_map("real", NS).data == {"a": "1"}
