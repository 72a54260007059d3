"""The embedded API server against the official `kubernetes` Python client: CRUD, selectors, conflicts,
validation, the three patch types, services, secrets, custom resources (schema, status and scale subresources,
versions), server-side dry run."""

from __future__ import annotations

import copy

import pytest
from apiserver_client_testlib import NS, WIDGET_CRD, pod_body
from kubernetes import client
from kubernetes.client.rest import ApiException


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
