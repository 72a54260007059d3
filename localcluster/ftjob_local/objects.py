"""Object helpers shared by the scheduler, kubelet, service proxy and preemption: paths, conditions, requests, events.

The bottom layer with client.py: imports nothing of ftjob_local above it.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone
from decimal import Decimal

from ftjob_trainer.contract import format_time_micro, now_rfc3339
from kubernetes.utils.quantity import parse_quantity

from .client import ApiError, Kube, Obj

log = logging.getLogger(__name__)

SPOT_LABEL = "ftjob.dev/spot"
PREEMPT_ANNOTATION = (
    "ftjob.dev/preempt-request"  # JSON written by `ftjob local preempt`, read by the node agent
)
RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}" + (f"/{sub}" if sub else "")


def node_path(name: str, sub: str = "") -> str:
    return f"/api/v1/nodes/{name}" + (f"/{sub}" if sub else "")


def meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


POD_NET, OWN_NET = "127.10.", "127.11."  # pod IPs (status.podIP) and the addresses pods bind (below)


def published_ports(pod: Obj) -> list[int]:
    """The TCP containerPorts a pod declares: the service proxy listens on podIP:port for them (netproxy.py)."""
    if (pod.get("spec") or {}).get("hostNetwork"):
        return []
    return sorted(
        {
            int(p["containerPort"])
            for c in (pod.get("spec") or {}).get("containers") or []
            for p in c.get("ports") or []
            if p.get("protocol", "TCP") == "TCP" and p.get("containerPort")
        }
    )


def own_ip(pod: Obj, pod_ip: str) -> str:
    """The address a pod's processes see as their own (downward API status.podIP) and bind to. A pod that declares
    ports gets 127.11.x.y for its pod IP 127.10.x.y, and the service proxy owns the pod IP's declared ports, so a
    connection to podIP:port passes its NetworkPolicy check as one through a Service does; other pods bind the pod
    IP itself."""
    if pod_ip.startswith(POD_NET) and published_ports(pod):
        return OWN_NET + pod_ip[len(POD_NET) :]
    return pod_ip


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def condition(obj: Obj, ctype: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def pod_ready(pod: Obj) -> bool:
    c = condition(pod, "Ready")
    return bool(c and c.get("status") == "True")


def set_condition(
    conditions: list[Obj], ctype: str, status: str, reason: str = "", message: str = ""
) -> list[Obj]:
    """Returns conditions with ctype set; lastTransitionTime only moves when the status changes."""
    out = [dict(c) for c in conditions]
    for c in out:
        if c.get("type") == ctype:
            if c.get("status") != status:
                c["lastTransitionTime"] = now_rfc3339()
            c.update(status=status, reason=reason or None, message=message or None)
            return out
    out.append(
        {
            "type": ctype,
            "status": status,
            "reason": reason or None,
            "message": message or None,
            "lastProbeTime": None,
            "lastTransitionTime": now_rfc3339(),
        }
    )
    return out


def pod_requests(pod: Obj) -> dict[str, Decimal]:
    """Effective requests as the scheduler counts them: sum over containers, max with each init container.

    A container without requests but with limits requests its limits (as the API server defaults them)."""

    def one(container: Obj) -> dict[str, Decimal]:
        res = container.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {r: parse_quantity(asked[r]) for r in RESOURCES if r in asked}

    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {r: Decimal(0) for r in RESOURCES}
    for c in spec.get("containers") or []:
        for r, q in one(c).items():
            total[r] += q
    for c in spec.get("initContainers") or []:
        for r, q in one(c).items():
            total[r] = max(total[r], q)
    return total


def post_event(
    kube: Kube,
    obj: Obj,
    reason: str,
    message: str,
    *,
    type_: str = "Normal",
    component: str = "kubelet",
    host: str = "",
) -> None:
    """Records a core/v1 Event about obj; failures are logged, never raised (events are best effort)."""
    m = meta(obj)
    namespace = m.get("namespace") or "default"
    kind = obj.get("kind") or ("Node" if not m.get("namespace") else "Pod")
    ts = now_rfc3339()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{m.get('name')}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": kind,
            "name": m.get("name"),
            "namespace": m.get("namespace"),
            "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"),
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component, **({"host": host} if host else {})},
        "reportingComponent": component,
        "reportingInstance": host or component,
        "firstTimestamp": ts,
        "lastTimestamp": ts,
        "eventTime": format_time_micro(datetime.now(timezone.utc)),
        "action": reason,
        "count": 1,
    }
    try:
        kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)
    except (ApiError, OSError) as e:
        log.warning("could not record event %s on %s: %s", reason, m.get("name"), e)
    except Exception as e:  # urllib3 errors while the API server restarts
        log.warning("could not record event %s on %s: %s", reason, m.get("name"), e)
