"""Admission of CustomResourceDefinitions: the checks kube-apiserver makes on names, scope, versions, schemas
(CEL rules included) and printer columns, and the status a CRD gets once accepted (its names, Established)."""

from __future__ import annotations

import copy
from typing import Any

from ftjob_trainer.contract import now_rfc3339

from . import tables
from .admission_core import AdmissionEnv
from .errors import FieldError, invalid
from .resources import ResourceType
from .schema import check_cel_rules


def admit_crd(env: AdmissionEnv, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """A CRD's names, scope, versions, schemas and printer columns; accepted CRDs are Established at once."""
    name = obj["metadata"]["name"]
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    names = spec.get("names") or {}
    group = spec.get("group") or ""
    if not group:
        errors.append(FieldError("spec.group", "Required value", "FieldValueRequired"))
    elif "." not in group:
        errors.append(
            FieldError("spec.group", f'Invalid value: "{group}": should be a domain with at least one dot')
        )
    for f in ("plural", "kind"):
        if not names.get(f):
            errors.append(FieldError(f"spec.names.{f}", "Required value", "FieldValueRequired"))
    if names.get("plural") and group and name != f"{names['plural']}.{group}":
        errors.append(
            FieldError("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group')
        )
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        errors.append(
            FieldError(
                "spec.scope",
                f'Unsupported value: "{scope}": supported values: "Cluster", "Namespaced"',
                "FieldValueNotSupported",
            )
        )
    versions = spec.get("versions") or []
    if not versions:
        errors.append(
            FieldError(
                "spec.versions", "Invalid value: must have exactly one version marked as storage version"
            )
        )
    elif sum(1 for v in versions if v.get("storage")) != 1:
        errors.append(
            FieldError(
                "spec.versions", "Invalid value: must have exactly one version marked as storage version"
            )
        )
    for i, v in enumerate(versions):
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        if not isinstance(schema, dict):
            errors.append(
                FieldError(
                    f"spec.versions[{i}].schema.openAPIV3Schema",
                    "Required value: schemas are required",
                    "FieldValueRequired",
                )
            )
            continue
        if schema.get("type") != "object":
            errors.append(
                FieldError(
                    f"spec.versions[{i}].schema.openAPIV3Schema.type",
                    "Required value: must be object at the root",
                    "FieldValueRequired",
                )
            )
        errors += check_cel_rules(schema, f"spec.versions[{i}].schema.openAPIV3Schema")
        for j, col in enumerate(v.get("additionalPrinterColumns") or []):
            where = f"spec.versions[{i}].additionalPrinterColumns[{j}]"
            for f in ("name", "type", "jsonPath"):
                if not col.get(f):
                    errors.append(FieldError(f"{where}.{f}", "Required value", "FieldValueRequired"))
            if col.get("type") and col["type"] not in ("integer", "number", "string", "boolean", "date"):
                errors.append(
                    FieldError(
                        f"{where}.type",
                        f'Unsupported value: "{col["type"]}": supported '
                        'values: "boolean", "date", "integer", "number", "string"',
                        "FieldValueNotSupported",
                    )
                )
            try:
                if col.get("jsonPath"):
                    tables.parse_column_path(col["jsonPath"])
            except Exception as e:  # jsonpath-ng raises several parse error types
                errors.append(FieldError(f"{where}.jsonPath", f'Invalid value: "{col["jsonPath"]}": {e}'))
        v.setdefault("served", True)
        v.setdefault("storage", False)
    if errors:
        raise invalid(rt.kind, rt.group, name, errors)
    names.setdefault("singular", names["kind"].lower())
    names.setdefault("listKind", names["kind"] + "List")
    spec.setdefault("conversion", {"strategy": "None"})
    now = now_rfc3339()
    storage = next(v["name"] for v in versions if v.get("storage"))
    stored = list(((old or {}).get("status") or {}).get("storedVersions") or [])
    if storage not in stored:
        stored.append(storage)
    obj["status"] = {
        "acceptedNames": copy.deepcopy(names),
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now,
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now,
            },
        ],
        "storedVersions": stored,
    }
