"""Checks every object gets, whatever its type: its name, its labels and annotations, its ownerReferences."""

from __future__ import annotations

import re
from typing import Any

from .errors import FieldError, invalid
from .resources import NS_KEY, SVC_KEY, ResourceType

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def name_errors(rt: ResourceType, name: str) -> list[FieldError]:
    if (
        rt.group == "rbac.authorization.k8s.io"
        or rt.key == ("", "events")
        or rt.key == ("events.k8s.io", "events")
    ):
        if name in (".", "..") or "/" in name or "%" in name:
            return [FieldError("metadata.name", f"Invalid value: \"{name}\": may not contain '/' or '%'")]
        return []
    if rt.key in (NS_KEY,):
        regex, limit, what = DNS1123_LABEL, 63, "a lowercase RFC 1123 label"
    elif rt.key == SVC_KEY:
        regex, limit, what = DNS1035_LABEL, 63, "a DNS-1035 label"
    else:
        regex, limit, what = DNS1123_SUBDOMAIN, 253, "a lowercase RFC 1123 subdomain"
    errs = []
    if len(name) > limit:
        errs.append(
            FieldError("metadata.name", f'Invalid value: "{name}": must be no more than {limit} characters')
        )
    if not regex.match(name):
        errs.append(
            FieldError(
                "metadata.name",
                f'Invalid value: "{name}": {what} must consist of lower case '
                "alphanumeric characters, '-'"
                + (" or '.'" if regex is DNS1123_SUBDOMAIN else "")
                + ", and must start and end with an alphanumeric character "
                f"(regex used for validation is '{regex.pattern[1:-1]}')",
            )
        )
    return errs


def label_errors(labels: dict[str, str]) -> list[FieldError]:
    """Label keys and values as Kubernetes validates them (a label that a real cluster refuses fails here too)."""
    errors = []
    for key, value in labels.items():
        prefix, _, label = key.rpartition("/")
        if (
            (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)))
            or len(label) > 63
            or not _LABEL_NAME.match(label)
        ):
            errors.append(
                FieldError(
                    "metadata.labels",
                    f'Invalid value: "{key}": a label key is an optional DNS '
                    "subdomain prefix and '/' followed by a name of at most 63 alphanumeric "
                    "characters, '-', '_' or '.', starting and ending with an alphanumeric",
                )
            )
        if len(value) > 63:
            errors.append(
                FieldError("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters')
            )
        elif value and not _LABEL_NAME.match(value):
            errors.append(
                FieldError(
                    "metadata.labels",
                    f'Invalid value: "{value}": a valid label must be an empty '
                    "string or consist of alphanumeric characters, '-', '_' or '.', and must start "
                    "and end with an alphanumeric character",
                )
            )
    return errors


def check_metadata(rt: ResourceType, meta: dict[str, Any]) -> None:
    """labels and annotations are maps of strings, labels are valid, ownerReferences are complete."""
    name = meta["name"]
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is not None and (
            not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
        ):
            raise invalid(
                rt.kind,
                rt.group,
                name,
                [
                    FieldError(
                        f"metadata.{field}",
                        "Invalid value: must be a map of string keys to string values",
                    )
                ],
            )
    errors = label_errors(meta.get("labels") or {})
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for f in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref, dict) or not ref.get(f):
                errors.append(
                    FieldError(f"metadata.ownerReferences[{i}].{f}", "Required value", "FieldValueRequired")
                )
    if errors:
        raise invalid(rt.kind, rt.group, name, errors)
