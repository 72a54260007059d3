"""Where the job's pods may go, rendered into their affinity (pure; render.py calls it).

Two rules, on top of what the user asked for in spec.scheduling.<role>.affinity (their terms are kept; ours are
added beside them, so both hold):

- spec.scheduling.spread: the workers of one restart generation keep off each other's nodes. Required is a
  required pod anti-affinity on kubernetes.io/hostname (a worker waits Pending rather than share a node), Preferred
  the same as a preference, None nothing. Anti-affinity rather than a topology spread constraint: "no two on one
  node" is exactly what anti-affinity says, while a spread's maxSkew counts against nodes the job cannot use.
  The selector names the restart generation, so a new generation does not wait for the old one's pods to end.
- Nodes that are going away (a termination taint, whatever its effect, or cordoned: a drain begins with a
  cordon) are excluded by name: a required node affinity `metadata.name NotIn [...]`, listed when the pod is
  created. kube-scheduler already refuses NoSchedule/NoExecute taints the pod does not tolerate and cordoned
  nodes, but not a PreferNoSchedule taint (aws-node-termination-handler's rebalance-recommendation), a taint of
  unknown effect from the chart's extraTerminationTaints, nor any of them for a pod that tolerates everything
  (`tolerations: [{operator: Exists}]`, common on GPU pools). Names rather than a label: the operator then needs
  no write access to nodes. A pod keeps the list it was created with: a node cordoned and uncordoned again while
  the pod waits stays excluded for that pod.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from .api.spread import SPREAD_PREFERRED, SPREAD_REQUIRED

HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
PREFERRED_WEIGHT = 100  # the largest weight a preferred term may carry
NODE_NAME_FIELD = "metadata.name"  # the one field a node selector's matchFields may name


def spread_term(selector: dict[str, str]) -> dict[str, Any]:
    """A pod affinity term over the pods that carry every label in `selector`, per node."""
    return {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": HOSTNAME_TOPOLOGY}


def with_spread(affinity: dict[str, Any], spread: str, selector: dict[str, str]) -> None:
    """Adds spec.scheduling.spread's anti-affinity term to `affinity` (in place)."""
    if spread == SPREAD_REQUIRED:
        anti = affinity.setdefault("podAntiAffinity", {})
        anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(spread_term(selector))
    elif spread == SPREAD_PREFERRED:
        anti = affinity.setdefault("podAntiAffinity", {})
        anti.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": PREFERRED_WEIGHT, "podAffinityTerm": spread_term(selector)}
        )


def with_nodes_avoided(affinity: dict[str, Any], nodes: Iterable[str]) -> None:
    """Adds `metadata.name NotIn nodes` to every required node selector term (terms are ORed, so each needs it)."""
    names = sorted(set(nodes))
    if not names:
        return
    required = affinity.setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {}
    )
    avoid = {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": names}
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**t, "matchFields": [*(t.get("matchFields") or []), avoid]} for t in terms
    ]


def pod_affinity(
    user: dict[str, Any] | None,
    *,
    spread: str | None = None,
    selector: dict[str, str] | None = None,
    avoid_nodes: Iterable[str] = (),
) -> dict[str, Any] | None:
    """The pod's affinity: the user's, plus the spread term (workers) and the nodes to avoid; None when empty."""
    affinity = copy.deepcopy(dict(user or {}))
    if spread and selector:
        with_spread(affinity, spread, selector)
    with_nodes_avoided(affinity, avoid_nodes)
    return affinity or None
