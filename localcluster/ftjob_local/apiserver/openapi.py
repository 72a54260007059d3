"""OpenAPI v3 documents for what is served. kubectl 1.32 reads them to learn that the server validates fields itself
(the `fieldValidation` query parameter on PATCH operations); `kubectl explain` reads the CRD schemas."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .resources import Registry, ResourceType


def gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _schema_name(rt: ResourceType, version: str) -> str:
    group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{group}.{version}.{rt.kind}"


def _params(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "query", "schema": {"type": "string"}, "uniqueItems": True} for n in names]


def gv_document(registry: Registry, group: str, version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for rt in registry.in_group_version(group, version):
        gvk = {"group": rt.group, "version": version, "kind": rt.kind}
        base = (
            "/"
            + gv_path(group, version)
            + ("/namespaces/{namespace}" if rt.namespaced else "")
            + "/"
            + rt.plural
        )
        ref = {
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{_schema_name(rt, version)}"}}
            }
        }

        def op(
            action: str, *params: str, gvk: dict[str, Any] = gvk, ref: dict[str, Any] = ref
        ) -> dict[str, Any]:
            return {
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": _params(*params),
                "responses": {"200": {"description": "OK", **ref}},
            }

        paths[base] = {
            "get": op("list", "labelSelector", "fieldSelector", "watch", "resourceVersion"),
            "post": op("post", "dryRun", "fieldManager", "fieldValidation"),
        }
        paths[base + "/{name}"] = {
            "get": op("get"),
            "put": op("put", "dryRun", "fieldManager", "fieldValidation"),
            "patch": op("patch", "dryRun", "fieldManager", "fieldValidation", "force"),
            "delete": op("delete", "dryRun", "gracePeriodSeconds", "propagationPolicy"),
        }
        for sub, served in (
            ("status", rt.has_status(version)),
            ("scale", rt.scale_spec(version) is not None),
        ):
            if served:
                paths[base + "/{name}/" + sub] = {
                    "get": op("get"),
                    "put": op("put", "fieldValidation"),
                    "patch": op("patch", "fieldValidation"),
                }
        if rt.crd is not None:
            schema = dict(
                rt.crd_version(version).get("schema", {}).get("openAPIV3Schema") or {"type": "object"}
            )
        else:
            schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        schema["x-kubernetes-group-version-kind"] = [gvk]
        schemas[_schema_name(rt, version)] = schema
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def doc_hash(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest().upper()


def index(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, versions in registry.groups().items():
        for version in versions:
            p = gv_path(group, version)
            paths[p] = {
                "serverRelativeURL": f"/openapi/v3/{p}?hash={doc_hash(gv_document(registry, group, version))}"
            }
    return {"paths": paths}
