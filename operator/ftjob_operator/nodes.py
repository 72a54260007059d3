"""The nodes as the operator keeps them: the planner's view of each node (`node_entry`, what the kopf index on
nodes holds and what a change of wakes the jobs), and the node list a pass hands to the planner (`node_view`)."""

from __future__ import annotations

from typing import Any


def node_entry(name: str, spec: Any, status: Any) -> dict[str, Any]:
    """What the planner reads of a node (planner/observed.py, Nodes): its taints, whether it is cordoned, and its
    Ready condition's status, without the heartbeat times that its agent rewrites every few seconds."""
    ready = [
        {"type": "Ready", "status": c.get("status")}
        for c in (status or {}).get("conditions") or []
        if c.get("type") == "Ready"
    ]
    return {
        "metadata": {"name": name},
        "spec": {"taints": list(spec.get("taints") or []), "unschedulable": bool(spec.get("unschedulable"))},
        "status": {"conditions": ready},
    }


def node_view(
    indexed: list[dict[str, Any]], pods: list[dict[str, Any]], deleted: set[str]
) -> list[dict[str, Any]] | None:
    """The node list for the planner, in which a missing node means "known gone".

    None while the index is empty (not synced yet). A pod's node that the index lacks but whose deletion we did
    not see (bound before its node's watch event arrived) is listed as present, without taints."""
    if not indexed:
        return None
    names = {n["metadata"]["name"] for n in indexed}
    out = list(indexed)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node not in names and node not in deleted:
            names.add(node)
            out.append({"metadata": {"name": node}, "spec": {"taints": []}})
    return out
