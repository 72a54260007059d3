"""Server-side printing: `Table` responses (what `kubectl get` asks for) with sensible columns for built-ins and
the additionalPrinterColumns of custom resources."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from ftjob_trainer.contract import parse_time
from jsonpath_ng.ext import parse as jsonpath_parse

from .resources import ResourceType

Column = tuple[str, str, int, Callable[[dict[str, Any]], Any]]  # name, type, priority, getter


def human_duration(ts: str | None) -> str:
    """kubectl's HumanDuration, as shown in AGE columns."""
    try:
        t = parse_time(ts)
    except ValueError:  # whatever a client wrote into a time field
        t = None
    if t is None:
        return "<unknown>"
    s = int((dt.datetime.now(dt.timezone.utc) - t).total_seconds())
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y"


def _age(o: dict[str, Any]) -> str:
    return human_duration(o["metadata"].get("creationTimestamp"))


def _pod_status(o: dict[str, Any]) -> str:
    status = o.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            t = state["terminated"]
            reason = t.get("reason") or (
                f"Signal:{t['signal']}" if t.get("signal") else f"ExitCode:{t.get('exitCode')}"
            )
    if o["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _pod_ready(o: dict[str, Any]) -> str:
    statuses = (o.get("status") or {}).get("containerStatuses") or []
    total = len((o.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for c in statuses if c.get('ready'))}/{total}"


def _pod_restarts(o: dict[str, Any]) -> int:
    return sum(
        int(c.get("restartCount") or 0) for c in (o.get("status") or {}).get("containerStatuses") or []
    )


def _node_status(o: dict[str, Any]) -> str:
    ready = next(
        (c for c in (o.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None
    )
    s = "Ready" if ready and ready.get("status") == "True" else "NotReady" if ready else "Unknown"
    if (o.get("spec") or {}).get("unschedulable"):
        s += ",SchedulingDisabled"
    return s


def _node_roles(o: dict[str, Any]) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = [k[len(prefix) :] for k in o["metadata"].get("labels") or {} if k.startswith(prefix)]
    return ",".join(sorted(roles)) or "<none>"


def _svc_ports(o: dict[str, Any]) -> str:
    ports = (o.get("spec") or {}).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _event_object(o: dict[str, Any]) -> str:
    ref = o.get("involvedObject") or o.get("regarding") or {}
    return f"{(ref.get('kind') or '').lower()}/{ref.get('name', '')}"


def _event_last_seen(o: dict[str, Any]) -> str:
    return human_duration(
        o.get("lastTimestamp") or o.get("eventTime") or o["metadata"].get("creationTimestamp")
    )


def _ready_replicas(o: dict[str, Any]) -> str:
    st = o.get("status") or {}
    return f"{st.get('readyReplicas', 0)}/{(o.get('spec') or {}).get('replicas', 1)}"


BUILTIN_COLUMNS: dict[tuple[str, str], list[Column]] = {
    ("", "pods"): [
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "string", 0, _pod_restarts),
        ("Age", "string", 0, _age),
        ("IP", "string", 1, lambda o: (o.get("status") or {}).get("podIP") or "<none>"),
        ("Node", "string", 1, lambda o: (o.get("spec") or {}).get("nodeName") or "<none>"),
        (
            "Nominated Node",
            "string",
            1,
            lambda o: (o.get("status") or {}).get("nominatedNodeName") or "<none>",
        ),
        ("Readiness Gates", "string", 1, lambda o: "<none>"),
    ],
    ("", "nodes"): [
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, _node_roles),
        ("Age", "string", 0, _age),
        (
            "Version",
            "string",
            0,
            lambda o: ((o.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""),
        ),
    ],
    ("", "services"): [
        ("Type", "string", 0, lambda o: (o.get("spec") or {}).get("type", "ClusterIP")),
        ("Cluster-IP", "string", 0, lambda o: (o.get("spec") or {}).get("clusterIP") or "<none>"),
        (
            "External-IP",
            "string",
            0,
            lambda o: ",".join((o.get("spec") or {}).get("externalIPs") or []) or "<none>",
        ),
        ("Port(s)", "string", 0, _svc_ports),
        ("Age", "string", 0, _age),
        (
            "Selector",
            "string",
            1,
            lambda o: (
                ",".join(f"{k}={v}" for k, v in ((o.get("spec") or {}).get("selector") or {}).items())
                or "<none>"
            ),
        ),
    ],
    ("", "namespaces"): [
        ("Status", "string", 0, lambda o: (o.get("status") or {}).get("phase", "Active")),
        ("Age", "string", 0, _age),
    ],
    ("", "configmaps"): [
        ("Data", "integer", 0, lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
        ("Age", "string", 0, _age),
    ],
    ("", "secrets"): [
        ("Type", "string", 0, lambda o: o.get("type", "Opaque")),
        ("Data", "integer", 0, lambda o: len(o.get("data") or {})),
        ("Age", "string", 0, _age),
    ],
    ("", "events"): [
        ("Last Seen", "string", 0, _event_last_seen),
        ("Type", "string", 0, lambda o: o.get("type", "")),
        ("Reason", "string", 0, lambda o: o.get("reason", "")),
        ("Object", "string", 0, _event_object),
        ("Message", "string", 0, lambda o: o.get("message") or o.get("note") or ""),
    ],
    ("events.k8s.io", "events"): [
        ("Last Seen", "string", 0, _event_last_seen),
        ("Type", "string", 0, lambda o: o.get("type", "")),
        ("Reason", "string", 0, lambda o: o.get("reason", "")),
        ("Object", "string", 0, _event_object),
        ("Message", "string", 0, lambda o: o.get("note", "")),
    ],
    ("apps", "deployments"): [
        ("Ready", "string", 0, _ready_replicas),
        ("Up-to-date", "integer", 0, lambda o: (o.get("status") or {}).get("updatedReplicas", 0)),
        ("Available", "integer", 0, lambda o: (o.get("status") or {}).get("availableReplicas", 0)),
        ("Age", "string", 0, _age),
    ],
    ("", "serviceaccounts"): [
        ("Secrets", "integer", 0, lambda o: len(o.get("secrets") or [])),
        ("Age", "string", 0, _age),
    ],
    ("coordination.k8s.io", "leases"): [
        ("Holder", "string", 0, lambda o: (o.get("spec") or {}).get("holderIdentity", "")),
        ("Age", "string", 0, _age),
    ],
    ("apiextensions.k8s.io", "customresourcedefinitions"): [
        ("Created At", "date", 0, lambda o: o["metadata"].get("creationTimestamp", "")),
    ],
    ("", "persistentvolumeclaims"): [
        ("Status", "string", 0, lambda o: (o.get("status") or {}).get("phase", "Pending")),
        ("Volume", "string", 0, lambda o: (o.get("spec") or {}).get("volumeName", "")),
        ("Age", "string", 0, _age),
    ],
}


def _to_jsonpath_ng(path: str) -> str:
    """Kubernetes JSONPath escapes dots in keys (`.metadata.labels.app\\.kubernetes\\.io/name`); jsonpath-ng wants
    such keys quoted."""
    parts, cur, i = [], "", 0
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    path = path.lstrip(".")
    depth = 0
    while i < len(path):
        ch = path[i]
        if ch == "\\" and i + 1 < len(path):
            cur += path[i + 1]
            i += 2
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "." and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    parts.append(cur)
    out = []
    for part in parts:
        head, bracket, rest = part.partition("[")
        if head and not head.replace("_", "a").replace("-", "a").isalnum():
            head = "'" + head.replace("'", "\\'") + "'"
        out.append(head + bracket + rest)
    return ".".join(out) or "$"


def parse_column_path(path: str) -> Any:
    return jsonpath_parse(_to_jsonpath_ng(path))


def _jsonpath_getter(path: str, kind: str) -> Callable[[dict[str, Any]], Any]:
    expr = parse_column_path(path)

    def get(obj: dict[str, Any]) -> Any:
        found = [m.value for m in expr.find(obj)]
        if not found:
            return None
        value = found[0]
        if kind == "date":
            return human_duration(value) if isinstance(value, str) else value
        return value

    return get


def columns_for(rt: ResourceType, version: str) -> list[Column]:
    if rt.crd is not None:
        cols = rt.crd_version(version).get("additionalPrinterColumns")
        if not cols:
            return [("Age", "date", 0, _age)]
        return [
            (
                c["name"],
                c.get("type", "string"),
                int(c.get("priority", 0)),
                _jsonpath_getter(c["jsonPath"], c.get("type", "string")),
            )
            for c in cols
        ]
    return BUILTIN_COLUMNS.get(rt.key, [("Age", "string", 0, _age)])


def partial_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def to_table(
    rt: ResourceType,
    version: str,
    objs: list[dict[str, Any]],
    rv: str,
    include_object: str,
    headers: bool = True,
) -> dict[str, Any]:
    cols = columns_for(rt, version)
    defs = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "priority": 0,
            "description": "Name must be unique within a namespace.",
        }
    ]
    defs += [
        {
            "name": n,
            "type": "string" if t == "date" else t,
            "format": "date" if t == "date" else "",
            "priority": p,
            "description": n,
        }
        for n, t, p, _ in cols
    ]
    rows = []
    for obj in objs:
        cells: list[Any] = [obj["metadata"]["name"]]
        for _, _, _, getter in cols:
            try:
                cells.append(getter(obj))
            except Exception:
                cells.append(None)
        row: dict[str, Any] = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = partial_metadata(obj)
        rows.append(row)
    table: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "rows": rows,
    }
    table["columnDefinitions"] = defs if headers else []
    return table
