"""The three patch types: JSON merge patch (RFC 7386), JSON patch (RFC 6902, via `jsonpatch`) and strategic merge
patch (the Kubernetes dialect kubectl apply/annotate/label send for built-in types)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from .errors import ApiError, bad_request

# patchMergeKey of the Go API types for lists that merge instead of being replaced (same key wherever the field name
# appears in the types ftjob, kubectl and helm touch). "ports" is keyed by containerPort in pods and port in services.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "podIPs": "ip",
    "topologySpreadConstraints": "topologyKey",
    "addresses": "type",
    "resourceClaims": "name",
}
# Lists of scalars with patchStrategy "merge": a patch adds to them.
_MERGE_SCALAR_LISTS = {"finalizers"}

PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise bad_request(
            "a JSON patch must be a list of operations, e.g. "
            '[{"op": "replace", "path": "/spec/replicas", "value": 3}]'
        )
    try:
        return jsonpatch.JsonPatch(operations).apply(copy.deepcopy(target))
    except (jsonpatch.JsonPatchConflict, jsonpatch.JsonPatchTestFailed) as e:
        raise ApiError(
            422, "Invalid", f"the server rejected our request due to an error in our request: {e}"
        ) from e
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as e:
        raise bad_request(f"invalid JSON patch: {e}") from e


def _merge_key_for(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        sample = next((i for i in items if isinstance(i, dict)), {})
        return "containerPort" if "containerPort" in sample else "port"
    return _MERGE_KEYS.get(field)


def _merge_list(field: str, original: Any, patch: list[Any]) -> list[Any]:
    original = original if isinstance(original, list) else []
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [i for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if field in _MERGE_SCALAR_LISTS:
        out = list(original)
        out.extend(v for v in patch if v not in out)
        return out
    key = _merge_key_for(field, patch + original)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return copy.deepcopy(patch)
    out = copy.deepcopy(original)
    for item in patch:
        idx = next(
            (n for n, o in enumerate(out) if isinstance(o, dict) and o.get(key) == item.get(key)), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(strategic_merge_patch({}, item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    patch = dict(patch)
    directive = patch.pop("$patch", None)
    if directive == "replace":
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.pop("$retainKeys", None)
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            continue  # ordering hint only
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    if isinstance(retain, list):
        for key in list(result):
            if key not in retain:
                del result[key]
    return result


def apply_patch(current: Any, body: Any, content_type: str, strategic: bool) -> Any:
    """`current` patched by `body` as its Content-Type says; `strategic`: whether the type takes strategic merge
    patches (built-ins do, custom resources do not)."""
    if content_type == "application/json-patch+json":
        return json_patch(current, body)
    if content_type == "application/merge-patch+json":
        return merge_patch(current, body)
    if content_type == "application/strategic-merge-patch+json":
        if not strategic:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - "
                "accepted media types include: application/json-patch+json, "
                "application/merge-patch+json, application/apply-patch+yaml",
            )
        return strategic_merge_patch(current, body)
    raise ApiError(
        415,
        "UnsupportedMediaType",
        f"unsupported patch type {content_type!r}: use "
        "application/json-patch+json, application/merge-patch+json or "
        "application/strategic-merge-patch+json",
    )
