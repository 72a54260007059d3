"""Admission: the defaults and checks an object goes through before it is stored, on create and on update.

Every object: its metadata (validation.check_metadata). A custom resource: its CRD's structural schema (pruning,
defaults, CEL rules). A built-in: unknown fields per `fieldValidation`, then the function ADMISSION names for its
type, if any. To admit a new built-in type, write its function and add one row to ADMISSION.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import builtin_schemas
from .admission_core import AdmissionEnv, admit_namespace, admit_pod, admit_secret, admit_service
from .admission_crd import admit_crd
from .errors import bad_request, invalid
from .resources import CRD_KEY, NS_KEY, POD_KEY, SECRET_KEY, SVC_KEY, Key, ResourceType
from .schema import process_custom_resource
from .validation import check_metadata

Admit = Callable[[AdmissionEnv, ResourceType, dict[str, Any], "dict[str, Any] | None"], None]

ADMISSION: dict[Key, Admit] = {
    POD_KEY: admit_pod,
    SVC_KEY: admit_service,
    NS_KEY: admit_namespace,
    SECRET_KEY: admit_secret,
    CRD_KEY: admit_crd,
}

__all__ = ["ADMISSION", "AdmissionEnv", "admit"]


def admit(
    env: AdmissionEnv,
    rt: ResourceType,
    version: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    params: Any,
) -> None:
    """Default and check `obj` in place; raise ApiError when it may not be stored. Warnings for the response go
    under obj["__warnings__"] (the caller removes them before storing)."""
    check_metadata(rt, obj["metadata"])
    if rt.crd is not None:
        _admit_custom(rt, version, obj, old, params)
        return
    mode = params.get("fieldValidation", "Warn") if hasattr(params, "get") else "Warn"
    if mode in ("Strict", "Warn"):
        unknown = builtin_schemas.unknown_fields(obj)
        if unknown and mode == "Strict":
            fields = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise bad_request(
                f'{rt.kind} in version "{rt.versions[0]}" cannot be handled as a {rt.kind}: '
                f"strict decoding error: {fields}"
            )
        if unknown:
            obj["__warnings__"] = [f'unknown field "{u}"' for u in unknown]
    type_admission = ADMISSION.get(rt.key)
    if type_admission is not None:
        type_admission(env, rt, obj, old)


def _admit_custom(
    rt: ResourceType, version: str, obj: dict[str, Any], old: dict[str, Any] | None, params: Any
) -> None:
    schema = (rt.crd_version(version).get("schema") or {}).get("openAPIV3Schema") or {}
    processed, unknown, errors = process_custom_resource(obj, old, schema)
    name = obj["metadata"]["name"]
    mode = params.get("fieldValidation", "Warn")
    if unknown and mode == "Strict":
        fields = ", ".join(f'unknown field "{u}"' for u in unknown)
        raise bad_request(
            f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: '
            f"strict decoding error: {fields}"
        )
    if errors:
        raise invalid(rt.kind, rt.group, name, errors)
    obj.clear()
    obj.update(processed)
    if unknown and mode == "Warn":
        obj["__warnings__"] = [f'unknown field "{u}"' for u in unknown]
