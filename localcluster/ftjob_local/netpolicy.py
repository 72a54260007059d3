"""NetworkPolicy ingress rules as Kubernetes defines them (networking.k8s.io/v1), for the service proxy.

`ingress_verdict(target, port, source, policies, namespace_labels)` decides one TCP connection to `target` (a pod
object) on `port` (the pod's port number) from `source` (the pod that opened it, or None for the node):
- the node's own traffic is always allowed (Kubernetes: "traffic to and from the node where a Pod is running is
  always allowed"); on the local cluster every process that is not a container's is the node's;
- a pod no policy of its namespace selects for Ingress is not isolated: everything is allowed;
- an isolated pod admits a connection when one ingress rule of one of those policies admits both its port (no
  `ports`: every port; a number, a range with `endPort`, or a name resolved on the target's container ports) and its
  source (no `from`: every source; `podSelector` alone: pods of the policy's namespace; `namespaceSelector`: pods of
  the namespaces it selects, narrowed by a `podSelector` beside it; `ipBlock`: the source pod's IP in the CIDR and
  not in an `except`). Everything else is denied.
Egress rules are not evaluated (the proxy sees only where a connection goes, and enforces at the destination).
Stdlib only: the unit tests drive it with plain dicts.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # the API server sets it on every namespace


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str
    policies: tuple[str, ...] = field(default=())  # the policies that isolate the target, namespace/name


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _namespace(obj: Obj) -> str:
    return _meta(obj).get("namespace", "default")


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: `{}` selects everything; matchLabels and matchExpressions must all hold."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # an operator the API would have refused selects nothing
    return True


def policy_types(policy: Obj) -> list[str]:
    """spec.policyTypes, defaulted as the API server does: Ingress, plus Egress when egress rules are given."""
    spec = policy.get("spec") or {}
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else []))


def isolating(target: Obj, policies: list[Obj]) -> list[Obj]:
    """The policies that isolate target for ingress: of its namespace, Ingress type, podSelector selecting it."""
    ns, labels = _namespace(target), _meta(target).get("labels") or {}
    return [
        p
        for p in policies
        if _namespace(p) == ns
        and "Ingress" in policy_types(p)
        and selects((p.get("spec") or {}).get("podSelector", {}), labels)
    ]


def _named_port(target: Obj, name: str, protocol: str) -> int | None:
    for c in (target.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == name and p.get("protocol", "TCP") == protocol:
                return int(p["containerPort"])
    return None


def port_admitted(rule_ports: list[Obj] | None, target: Obj, port: int) -> bool:
    if not rule_ports:
        return True
    for rp in rule_ports:
        protocol = rp.get("protocol", "TCP")
        if protocol != "TCP":
            continue
        want = rp.get("port")
        if want is None:
            return True
        if isinstance(want, int) or (isinstance(want, str) and want.isdigit()):
            if int(want) <= port <= int(rp.get("endPort") or want):
                return True
        elif _named_port(target, want, protocol) == port:
            return True
    return False


def _in_block(block: Obj, ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
        if addr not in ipaddress.ip_network(block["cidr"], strict=False):
            return False
        return not any(addr in ipaddress.ip_network(e, strict=False) for e in block.get("except") or [])
    except (KeyError, ValueError):
        return False


def peer_admitted(peer: Obj, policy_namespace: str, source: Obj, namespace_labels: dict[str, dict]) -> bool:
    if "ipBlock" in peer:
        return _in_block(peer["ipBlock"], (source.get("status") or {}).get("podIP") or "")
    source_ns, source_labels = _namespace(source), _meta(source).get("labels") or {}
    pod_selector, ns_selector = peer.get("podSelector"), peer.get("namespaceSelector")
    if ns_selector is None:
        if pod_selector is None:
            return False  # an empty peer: the API server refuses it
        return source_ns == policy_namespace and selects(pod_selector, source_labels)
    ns_labels = namespace_labels.get(source_ns) or {NAMESPACE_NAME_LABEL: source_ns}
    if not selects(ns_selector, ns_labels):
        return False
    return pod_selector is None or selects(pod_selector, source_labels)


def ingress_verdict(
    target: Obj, port: int, source: Obj | None, policies: list[Obj], namespace_labels: dict[str, dict]
) -> Verdict:
    if source is None:
        return Verdict(True, "from the node (always allowed)")
    isolated_by = isolating(target, policies)
    names = tuple(f"{_namespace(p)}/{_meta(p).get('name')}" for p in isolated_by)
    if not isolated_by:
        return Verdict(True, "no NetworkPolicy selects the pod")
    for policy, name in zip(isolated_by, names, strict=True):
        for rule in (policy.get("spec") or {}).get("ingress") or []:
            if not port_admitted(rule.get("ports"), target, port):
                continue
            peers = rule.get("from")
            if not peers or any(
                peer_admitted(p, _namespace(policy), source, namespace_labels) for p in peers
            ):
                return Verdict(True, f"admitted by {name}", names)
    return Verdict(False, f"no ingress rule of {', '.join(names)} admits it", names)
