"""The subresource table (ftjob_local.apiserver.subresources.SUBRESOURCES) is the one description of subresources:
discovery lists exactly its entries, dispatch reaches exactly its handlers, and a new entry needs nothing else."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from aiohttp import web
from ftjob_local.apiserver import subresources
from ftjob_local.apiserver.resources import POD_KEY
from ftjob_local.apiserver.wire import json_response

SCALED_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gadgets.test.ftjob.dev"},
    "spec": {
        "group": "test.ftjob.dev",
        "scope": "Namespaced",
        "names": {"plural": "gadgets", "kind": "Gadget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas"}},
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "main", "image": "python:3.12"}]},
}


def call(
    server, method: str, path: str, body: dict | None = None, headers: dict | None = None
) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def discovered_subresources(server, gv_path: str) -> dict[str, dict]:
    code, doc = call(server, "GET", gv_path)
    assert code == 200, doc
    return {r["name"]: r for r in doc["resources"] if "/" in r["name"]}


def table_subresources(server, group: str, version: str) -> dict[str, dict]:
    registry = server.server.registry
    return {
        f"{rt.plural}/{sub.name}": sub.discovery(rt)
        for rt in registry.in_group_version(group, version)
        for sub in subresources.served(rt, version)
    }


def test_discovery_lists_exactly_the_tables_subresources(server):
    assert (
        call(server, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SCALED_CRD)[0] == 201
    )
    for group, versions in server.server.registry.groups().items():
        for version in versions:
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            assert discovered_subresources(server, path) == table_subresources(server, group, version), path
    core = discovered_subresources(server, "/api/v1")
    assert {n for n in core if n.startswith("pods/")} == {
        "pods/status",
        "pods/log",
        "pods/eviction",
        "pods/binding",
    }
    assert core["pods/log"]["verbs"] == ["get"]
    assert core["pods/eviction"] == {
        "name": "pods/eviction",
        "singularName": "",
        "namespaced": True,
        "kind": "Eviction",
        "verbs": ["create"],
        "group": "policy",
        "version": "v1",
    }
    assert core["serviceaccounts/token"]["verbs"] == ["create"]
    assert not any(n.startswith("configmaps/") for n in core)
    apps = discovered_subresources(server, "/apis/apps/v1")
    assert apps["deployments/status"]["verbs"] == ["get", "patch", "update"]
    assert (
        apps["deployments/scale"]["kind"] == "Scale" and apps["deployments/scale"]["group"] == "autoscaling"
    )
    custom = discovered_subresources(server, "/apis/test.ftjob.dev/v1")
    assert set(custom) == {"gadgets/status", "gadgets/scale"}


def test_dispatch_answers_only_what_the_table_serves(server):
    assert call(server, "POST", "/api/v1/namespaces/default/pods", POD)[0] == 201
    base = "/api/v1/namespaces/default/pods/p"
    code, status = call(server, "DELETE", base + "/status")
    assert (code, status["reason"]) == (405, "MethodNotAllowed")
    assert "get, patch, update" in status["message"]
    assert call(server, "GET", base + "/eviction")[0] == 405
    assert call(server, "GET", base + "/nope")[0] == 404
    assert call(server, "GET", "/api/v1/namespaces/default/configmaps/x/status")[0] == 404
    code, status = call(server, "GET", base + "/exec")
    assert code == 400 and "not supported by the ftjob local cluster" in status["message"]
    code, pod = call(server, "GET", base + "/status")
    assert code == 200 and pod["metadata"]["name"] == "p"


def test_a_new_table_entry_is_discovered_dispatched_and_authorized(server, monkeypatch):
    """What adding e.g. pods/ephemeralcontainers would take: one entry (and its handler), nothing else."""

    async def get_echo(c: subresources.Call) -> web.StreamResponse:
        return json_response({"echo": c.named(), "namespace": c.ns})

    echo = subresources.Subresource("echo", lambda rt, version: rt.key == POD_KEY, {"GET": get_echo}, "Echo")
    monkeypatch.setattr(subresources, "SUBRESOURCES", (*subresources.SUBRESOURCES, echo))
    assert call(server, "POST", "/api/v1/namespaces/default/pods", POD)[0] == 201

    entry = discovered_subresources(server, "/api/v1")["pods/echo"]
    assert entry == {
        "name": "pods/echo",
        "singularName": "",
        "namespaced": True,
        "kind": "Echo",
        "verbs": ["get"],
    }
    assert call(server, "GET", "/api/v1/namespaces/default/pods/p/echo") == (
        200,
        {"echo": "p", "namespace": "default"},
    )
    assert call(server, "PUT", "/api/v1/namespaces/default/pods/p/echo", {})[0] == 405
    # RBAC sees it as pods/echo like any other subresource: a user with no role is refused.
    code, status = call(
        server, "GET", "/api/v1/namespaces/default/pods/p/echo", headers={"Impersonate-User": "alice"}
    )
    assert code == 403 and 'subresource "echo"' in status["message"]
