"""Decoding the few protobuf request bodies that typed client-go clients send (helm's release Secrets, `kubectl
create secret|configmap`, DeleteOptions and Evictions): the `k8s\\0` envelope (runtime.Unknown) around the
generated.proto messages. Responses stay JSON, which those clients also accept."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from .errors import ApiError

MAGIC = b"k8s\x00"


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, Any]]:
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((num, value))
    return out


def _time(buf: bytes) -> str:
    f = dict(_fields(buf))
    return dt.datetime.fromtimestamp(f.get(1, 0), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# field number -> (json name, how to decode)
OWNER_REF = {
    1: ("kind", "s"),
    3: ("name", "s"),
    4: ("uid", "s"),
    5: ("apiVersion", "s"),
    6: ("controller", "b"),
    7: ("blockOwnerDeletion", "b"),
}
OBJECT_META = {
    1: ("name", "s"),
    2: ("generateName", "s"),
    3: ("namespace", "s"),
    5: ("uid", "s"),
    6: ("resourceVersion", "s"),
    7: ("generation", "i"),
    8: ("creationTimestamp", "time"),
    11: ("labels", "map_ss"),
    12: ("annotations", "map_ss"),
    13: ("ownerReferences", ("list", OWNER_REF)),
    14: ("finalizers", "list_s"),
}
PRECONDITIONS = {1: ("uid", "s"), 2: ("resourceVersion", "s")}
DELETE_OPTIONS = {
    1: ("gracePeriodSeconds", "i"),
    2: ("preconditions", ("msg", PRECONDITIONS)),
    3: ("orphanDependents", "b"),
    4: ("propagationPolicy", "s"),
    5: ("dryRun", "list_s"),
}
RESOURCE_ATTRIBUTES = {
    1: ("namespace", "s"),
    2: ("verb", "s"),
    3: ("group", "s"),
    4: ("version", "s"),
    5: ("resource", "s"),
    6: ("subresource", "s"),
    7: ("name", "s"),
}
NON_RESOURCE_ATTRIBUTES = {1: ("path", "s"), 2: ("verb", "s")}
POLICY_RULE = {
    1: ("verbs", "list_s"),
    2: ("apiGroups", "list_s"),
    3: ("resources", "list_s"),
    4: ("resourceNames", "list_s"),
    5: ("nonResourceURLs", "list_s"),
}
SUBJECT = {1: ("kind", "s"), 2: ("apiGroup", "s"), 3: ("name", "s"), 4: ("namespace", "s")}
ROLE_REF = {1: ("apiGroup", "s"), 2: ("kind", "s"), 3: ("name", "s")}
LOCAL_REF = {1: ("name", "s")}
_META = ("metadata", ("msg", OBJECT_META))
_ROLE = {1: _META, 2: ("rules", ("list", POLICY_RULE))}
_BINDING = {1: _META, 2: ("subjects", ("list", SUBJECT)), 3: ("roleRef", ("msg", ROLE_REF))}
MESSAGES: dict[str, dict[int, Any]] = {
    "Namespace": {1: _META, 2: ("spec", ("msg", {1: ("finalizers", "list_s")}))},
    "ServiceAccount": {
        1: _META,
        2: ("secrets", ("list", LOCAL_REF)),
        3: ("imagePullSecrets", ("list", LOCAL_REF)),
        4: ("automountServiceAccountToken", "b"),
    },
    "Role": _ROLE,
    "ClusterRole": _ROLE,
    "RoleBinding": _BINDING,
    "ClusterRoleBinding": _BINDING,
    "TokenRequest": {
        1: _META,
        2: ("spec", ("msg", {1: ("audiences", "list_s"), 4: ("expirationSeconds", "i")})),
    },
    "SelfSubjectAccessReview": {
        1: _META,
        2: (
            "spec",
            (
                "msg",
                {
                    1: ("resourceAttributes", ("msg", RESOURCE_ATTRIBUTES)),
                    2: ("nonResourceAttributes", ("msg", NON_RESOURCE_ATTRIBUTES)),
                },
            ),
        ),
    },
    "SubjectAccessReview": {
        1: _META,
        2: (
            "spec",
            (
                "msg",
                {
                    1: ("resourceAttributes", ("msg", RESOURCE_ATTRIBUTES)),
                    2: ("nonResourceAttributes", ("msg", NON_RESOURCE_ATTRIBUTES)),
                    3: ("user", "s"),
                    4: ("groups", "list_s"),
                    6: ("uid", "s"),
                },
            ),
        ),
    },
    "Secret": {
        1: ("metadata", ("msg", OBJECT_META)),
        2: ("data", "map_sb"),
        3: ("type", "s"),
        4: ("stringData", "map_ss"),
        5: ("immutable", "b"),
    },
    "ConfigMap": {
        1: ("metadata", ("msg", OBJECT_META)),
        2: ("data", "map_ss"),
        3: ("binaryData", "map_sb"),
        4: ("immutable", "b"),
    },
    "DeleteOptions": DELETE_OPTIONS,
    "Eviction": {1: ("metadata", ("msg", OBJECT_META)), 2: ("deleteOptions", ("msg", DELETE_OPTIONS))},
}


def _decode(buf: bytes, spec: dict[int, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for num, value in _fields(buf):
        if num not in spec:
            continue
        name, how = spec[num]
        if how == "s":
            if value:  # gogo-protobuf writes empty strings that JSON (omitempty) leaves out
                out[name] = value.decode()
        elif how == "b":
            out[name] = bool(value)
        elif how == "i":
            out[name] = _int64(value)
        elif how == "time":
            out[name] = _time(value)
        elif how == "list_s":
            out.setdefault(name, []).append(value.decode())
        elif how in ("map_ss", "map_sb"):
            entry = dict(_fields(value))
            raw = entry.get(2, b"")
            out.setdefault(name, {})[entry.get(1, b"").decode()] = (
                raw.decode() if how == "map_ss" else base64.b64encode(raw).decode()
            )
        elif how[0] == "msg":
            out[name] = _decode(value, how[1])
        elif how[0] == "list":
            out.setdefault(name, []).append(_decode(value, how[1]))
    return out


def decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise ApiError(415, "UnsupportedMediaType", "a protobuf body must start with the k8s\\0 envelope")
    envelope = dict(_fields(body[len(MAGIC) :]))
    type_meta = dict(_fields(envelope.get(1, b"")))
    api_version, kind = type_meta.get(1, b"").decode(), type_meta.get(2, b"").decode()
    spec = MESSAGES.get(kind)
    if spec is None:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"protobuf bodies of kind {kind!r} are not supported by the "
            "local API server; send JSON (Content-Type: application/json), e.g. with `kubectl apply -f`",
        )
    obj = _decode(envelope.get(2, b""), spec)
    if kind not in ("DeleteOptions",):
        obj = {"apiVersion": api_version, "kind": kind, **obj}
    return obj
