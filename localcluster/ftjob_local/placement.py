"""Placement rules between pods, as kube-scheduler's InterPodAffinity and PodTopologySpread plugins apply them, for
what ftjob renders (docs/scheduling.md): label selectors, node selector terms with matchFields, required and
preferred pod (anti-)affinity over any topology key, and topology spread constraints (DoNotSchedule filters,
ScheduleAnyway scores). Pure functions over JSON objects; the scheduler (scheduler.py) owns the loop.

`Placed` is the scheduler's view of one pass: which live pods sit on which node, updated as pods are bound in it.
Simplifications: namespaceSelector is read as "every namespace" when set, and minDomains, matchLabelKeys and the
node inclusion policies take their defaults.
"""

from __future__ import annotations

from collections import defaultdict

from .client import Obj
from .objects import meta

POD_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
POD_AFFINITY = "node(s) didn't match pod affinity rules"
SPREAD = "node(s) didn't match pod topology spread constraints"
SPREAD_MISSING_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"


# --- selectors ---------------------------------------------------------------------------------------------------
def match_expression(labels: dict, expr: Obj) -> bool:
    """One requirement of a node selector term or a label selector (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    has = key in labels
    if op == "In":
        return has and labels[key] in values
    if op == "NotIn":
        return not has or labels[key] not in values
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if op in ("Gt", "Lt") and has and values:
        try:
            a, b = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_term_matches(term: Obj, node: Obj) -> bool:
    """A node selector term: its matchExpressions on labels and matchFields on metadata.name, all of them."""
    labels = meta(node).get("labels") or {}
    fields = {"metadata.name": meta(node).get("name")}
    return all(match_expression(labels, e) for e in term.get("matchExpressions") or []) and all(
        match_expression(fields, f) for f in term.get("matchFields") or []
    )


def selector_matches(selector: Obj | None, labels: dict) -> bool:
    """A metav1.LabelSelector: None selects nothing, {} everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(match_expression(labels, e) for e in selector.get("matchExpressions") or [])


# --- where pods are ---------------------------------------------------------------------------------------------
class Placed:
    """The live pods bound (or assumed bound) to each node, for one scheduling pass."""

    def __init__(self, nodes: dict[str, Obj]):
        self.nodes = nodes
        self.on: dict[str, list[Obj]] = defaultdict(list)

    def add(self, pod: Obj, node: str) -> None:
        self.on[node].append(pod)

    def domain(self, node: Obj, key: str) -> str | None:
        return (meta(node).get("labels") or {}).get(key)

    def in_domain(self, key: str, value: str) -> list[Obj]:
        """Pods on every node whose label `key` is `value`."""
        return [
            p for name, n in self.nodes.items() if self.domain(n, key) == value for p in self.on.get(name, [])
        ]


def _term_selects(term: Obj, owner: Obj, other: Obj) -> bool:
    """Whether a pod affinity term of `owner` selects the pod `other` (namespaces default to the owner's)."""
    if "namespaceSelector" in term:
        namespaces = None  # simplified: a namespaceSelector selects every namespace
    else:
        namespaces = term.get("namespaces") or [meta(owner).get("namespace", "default")]
    if namespaces is not None and meta(other).get("namespace", "default") not in namespaces:
        return False
    return selector_matches(term.get("labelSelector"), meta(other).get("labels") or {})


def _affinity(pod: Obj, kind: str, mode: str) -> list[Obj]:
    return (((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}).get(
        f"{mode}DuringSchedulingIgnoredDuringExecution"
    ) or []


def _others(pod: Obj, pods: list[Obj]) -> list[Obj]:
    uid = meta(pod).get("uid")
    return [p for p in pods if not uid or meta(p).get("uid") != uid]


# --- filters ----------------------------------------------------------------------------------------------------
def inter_pod_filter(pod: Obj, node: Obj, placed: Placed) -> str | None:
    """None when `pod` may go to `node` by the pod (anti-)affinity and topology spread rules, else the reason."""
    for term in _affinity(pod, "podAntiAffinity", "required"):
        value = placed.domain(node, term.get("topologyKey", ""))
        if value is not None and any(
            _term_selects(term, pod, p) for p in _others(pod, placed.in_domain(term["topologyKey"], value))
        ):
            return POD_ANTI_AFFINITY
    for name, pods in placed.on.items():  # existing pods' required anti-affinity against this pod
        there = placed.nodes.get(name)
        for other in _others(pod, pods) if there is not None else []:
            for term in _affinity(other, "podAntiAffinity", "required"):
                key = term.get("topologyKey", "")
                same = placed.domain(node, key) is not None and placed.domain(node, key) == placed.domain(
                    there, key
                )
                if same and _term_selects(term, other, pod):
                    return EXISTING_ANTI_AFFINITY
    for term in _affinity(pod, "podAffinity", "required"):
        key = term.get("topologyKey", "")
        value = placed.domain(node, key)
        anywhere = [p for ps in placed.on.values() for p in _others(pod, ps) if _term_selects(term, pod, p)]
        here = value is not None and any(
            _term_selects(term, pod, p) for p in _others(pod, placed.in_domain(key, value))
        )
        # The first pod of a group that selects itself may go anywhere (kube-scheduler's rule).
        if not here and (anywhere or not _term_selects(term, pod, pod) or value is None):
            return POD_AFFINITY
    return _spread_filter(pod, node, placed)


def _spread_counts(pod: Obj, constraint: Obj, placed: Placed, eligible: list[Obj]) -> dict[str, int]:
    """Matching pods per domain of the constraint's topology key, over the eligible nodes."""
    key = constraint.get("topologyKey", "")
    counts: dict[str, int] = {}
    for n in eligible:
        value = placed.domain(n, key)
        if value is None:
            continue
        on = _others(pod, placed.on.get(meta(n)["name"], []))
        mine = [p for p in on if meta(p).get("namespace", "default") == meta(pod).get("namespace", "default")]
        counts[value] = counts.get(value, 0) + sum(
            selector_matches(constraint.get("labelSelector"), meta(p).get("labels") or {}) for p in mine
        )
    return counts


def _constraints(pod: Obj, when: str) -> list[Obj]:
    return [
        c
        for c in (pod.get("spec") or {}).get("topologySpreadConstraints") or []
        if c.get("whenUnsatisfiable", "DoNotSchedule") == when
    ]


def _spread_filter(pod: Obj, node: Obj, placed: Placed) -> str | None:
    from_selector = [n for n in placed.nodes.values() if _fits_node_selection(pod, n)]
    for c in _constraints(pod, "DoNotSchedule"):
        value = placed.domain(node, c.get("topologyKey", ""))
        if value is None:
            return SPREAD_MISSING_LABEL
        counts = _spread_counts(pod, c, placed, from_selector)
        self_match = selector_matches(c.get("labelSelector"), meta(pod).get("labels") or {})
        skew = counts.get(value, 0) + int(self_match) - min(counts.values(), default=0)
        if skew > int(c.get("maxSkew", 1)):
            return SPREAD
    return None


def _fits_node_selection(pod: Obj, node: Obj) -> bool:
    """nodeSelector and required node affinity (topology spread's default nodeAffinityPolicy: Honor)."""
    spec = pod.get("spec") or {}
    labels = meta(node).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(node_term_matches(t, node) for t in terms)


# --- scores -----------------------------------------------------------------------------------------------------
def inter_pod_penalty(pod: Obj, node: Obj, placed: Placed) -> int:
    """Lower is better: preferred anti-affinity weight per selected pod in the node's domain, minus preferred
    affinity weight per selected pod, plus one per pod that a ScheduleAnyway spread constraint counts there."""
    penalty = 0
    for sign, kind in ((1, "podAntiAffinity"), (-1, "podAffinity")):
        for weighted in _affinity(pod, kind, "preferred"):
            term = weighted.get("podAffinityTerm") or {}
            value = placed.domain(node, term.get("topologyKey", ""))
            if value is None:
                continue
            near = _others(pod, placed.in_domain(term["topologyKey"], value))
            penalty += sign * int(weighted.get("weight", 1)) * sum(_term_selects(term, pod, p) for p in near)
    eligible = [n for n in placed.nodes.values() if _fits_node_selection(pod, n)]
    for c in _constraints(pod, "ScheduleAnyway"):
        value = placed.domain(node, c.get("topologyKey", ""))
        penalty += _spread_counts(pod, c, placed, eligible).get(value, 0) if value is not None else 1_000
    return penalty


def node_fits_affinity(pod: Obj, node: Obj) -> bool:
    """Required node affinity only (the nodeSelector is filtered on its own, with its own reason)."""
    spec = dict(pod.get("spec") or {})
    spec.pop("nodeSelector", None)
    return _fits_node_selection({"spec": spec}, node)
