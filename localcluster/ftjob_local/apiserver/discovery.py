"""Discovery documents: /version, /api, /apis, /apis/<group> and the APIResourceList of each group version (the
resources of the registry, their subresources from subresources.SUBRESOURCES)."""

from __future__ import annotations

from typing import Any

from .resources import Registry, ResourceType
from .subresources import served

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-ftjob-local",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
ROOT_PATHS = {"paths": ["/api", "/api/v1", "/apis", "/healthz", "/openapi/v3", "/version"]}
# POST /api/v1/namespaces/<ns>/bindings binds the pod the body names (older schedulers use it).
BINDINGS = {
    "name": "bindings",
    "singularName": "binding",
    "namespaced": True,
    "kind": "Binding",
    "verbs": ["create"],
}


def verbs(rt: ResourceType) -> list[str]:
    if rt.group == "authorization.k8s.io":
        return ["create"]  # access reviews are answered, never stored
    return ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def api_versions(address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def api_group(group: str, versions: list[str]) -> dict[str, Any]:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = [api_group(g, vs) for g, vs in registry.groups().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(registry: Registry, group: str, version: str) -> dict[str, Any]:
    resources = []
    for rt in registry.in_group_version(group, version):
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": verbs(rt),
        }
        if rt.short_names:
            entry["shortNames"] = rt.short_names
        if rt.categories:
            entry["categories"] = rt.categories
        resources.append(entry)
        resources += [sub.discovery(rt) for sub in served(rt, version)]
    if group == "" and version == "v1":
        resources.append(dict(BINDINGS))
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
