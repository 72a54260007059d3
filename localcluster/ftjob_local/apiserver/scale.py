"""The scale subresource (autoscaling/v1 Scale): replicas read from and written to the paths the type declares
(a CRD's subresources.scale, or .spec.replicas/.status.replicas for Deployments and the like)."""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError, FieldError, conflict, invalid
from .objects import Objects, served
from .patch import json_patch, merge_patch
from .resources import ResourceType


def scale_of(rt: ResourceType, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    spec = rt.scale_spec(version) or {}
    meta = obj["metadata"]
    scale: dict[str, Any] = {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {},
        "status": {"replicas": 0},
    }
    replicas = _get_path(obj, spec.get("specReplicasPath", ".spec.replicas"))
    if replicas is not None:
        scale["spec"]["replicas"] = replicas
    status_replicas = _get_path(obj, spec.get("statusReplicasPath", ".status.replicas"))
    scale["status"]["replicas"] = status_replicas or 0
    if spec.get("labelSelectorPath"):
        selector = _get_path(obj, spec["labelSelectorPath"])
        if selector is not None:
            scale["status"]["selector"] = selector
    return scale


def set_scale(
    objects: Objects,
    rt: ResourceType,
    version: str,
    ns: str,
    name: str,
    body: Any,
    method: str,
    content_type: str,
    params: Any,
) -> dict[str, Any]:
    obj = objects.get(rt, ns, name)
    current = scale_of(rt, version, obj)
    if method == "PUT":
        new_scale = body
    elif content_type == "application/json-patch+json":
        new_scale = json_patch(current, body)
    elif content_type in (
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
    ):
        new_scale = merge_patch(current, body)
    else:
        raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {content_type!r}")
    rv = (new_scale.get("metadata") or {}).get("resourceVersion")
    if rv and rv != obj["metadata"]["resourceVersion"]:
        raise conflict(rt.plural, rt.group, name)
    replicas = (new_scale.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int) or replicas < 0:
        raise invalid(
            "Scale",
            "autoscaling",
            name,
            [FieldError("spec.replicas", f"Invalid value: {replicas}: must be a non-negative integer")],
        )
    new = served(rt, version, copy.deepcopy(obj))
    _set_path(new, (rt.scale_spec(version) or {}).get("specReplicasPath", ".spec.replicas"), replicas)
    updated = objects.update(rt, version, ns, name, new, params)
    return scale_of(rt, version, updated)


def _get_path(obj: Any, path: str) -> Any:
    cur = obj
    for part in path.lstrip(".").split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.lstrip(".").split(".")
    cur = obj
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
