"""Unknown-field detection for built-in kinds (what `fieldValidation=Strict`, kubectl's default, refuses on a real
cluster), from the Kubernetes 1.32 JSON schemas that the `kubernetes-validate` package ships. Without that package
the check is skipped."""

from __future__ import annotations

import functools
import re
from typing import Any

K8S_VERSION = "1.32"


@functools.cache
def _validator(api_version: str, kind: str) -> Any:
    try:
        import jsonschema
        from kubernetes_validate import utils as kvu
        from referencing import Registry, Resource
    except ImportError:
        return None
    version = [v for v in kvu.all_versions() if kvu.major_minor(v) <= K8S_VERSION][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kvu.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", K8S_VERSION)
        definitions = kvu.schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
    except (FileNotFoundError, kvu.InvalidSchemaError):
        return None
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def unknown_fields(obj: dict[str, Any]) -> list[str]:
    """Paths of fields the built-in kind does not have, e.g. `spec.containers[0].imagePullPolice`."""
    validator = _validator(obj.get("apiVersion", ""), obj.get("kind", ""))
    if validator is None:
        return []
    found = []
    for err in validator.iter_errors(obj):
        if err.validator != "additionalProperties" or not isinstance(err.instance, dict):
            continue
        known = set((err.schema.get("properties") or {}).keys())
        base = _path(err.absolute_path)
        for key in err.instance:
            if key not in known:
                found.append(f"{base}.{key}" if base else key)
    return sorted(set(found))
