"""Placement rules between pods, as kube-scheduler's InterPodAffinity and PodTopologySpread plugins apply them, for
what ftjob renders (docs/scheduling.md): label selectors, node selector terms with matchFields, required and
preferred pod (anti-)affinity over any topology key, and topology spread constraints (DoNotSchedule filters,
ScheduleAnyway scores). Pure functions over JSON objects; the scheduler (scheduler.py) owns the loop.

`Placed` is the scheduler's view: which live pods sit on which node, indexed by label, updated as pods come and go.
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
def _uid(pod: Obj) -> str:
    return meta(pod).get("uid") or f"object-{id(pod)}"


def _pairs(selector: Obj | None) -> list[tuple[str, str]]:
    return sorted(((selector or {}).get("matchLabels") or {}).items())


class Placed:
    """The live pods bound (or assumed bound) to each node, kept by the scheduler across passes and updated as
    pods come, go and are bound. Pods are indexed by label pair and existing pods' required anti-affinity terms by
    one pair of their selector, so a rule looks at the pods its selector can pick, not at every pod (issue 15)."""

    def __init__(self, nodes: dict[str, Obj]):
        self.nodes = nodes
        self.on: dict[str, dict[str, Obj]] = defaultdict(dict)  # node -> uid -> pod
        self._node_of: dict[str, str] = {}
        self._by_label: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._anti: dict[tuple[str, str] | None, set[tuple[str, int]]] = defaultdict(
            set
        )  # bucket -> (uid, term)
        self._anti_of: dict[str, list[tuple[str, str] | None]] = {}
        self.visited = 0  # pods and terms looked at: what the tests bound

    def add(self, pod: Obj, node: str) -> None:
        uid = _uid(pod)
        self.remove(uid)
        self.on[node][uid], self._node_of[uid] = pod, node
        for pair in (meta(pod).get("labels") or {}).items():
            self._by_label[pair].add(uid)
        buckets: list[tuple[str, str] | None] = []
        for i, term in enumerate(_affinity(pod, "podAntiAffinity", "required")):
            pairs = _pairs(term.get("labelSelector"))
            bucket = min(pairs, key=lambda b: len(self._anti.get(b) or ())) if pairs else None
            self._anti[bucket].add((uid, i))
            buckets.append(bucket)
        self._anti_of[uid] = buckets

    def remove(self, uid: str) -> None:
        node = self._node_of.pop(uid, None)
        if node is None:
            return
        pod = self.on[node].pop(uid)
        for pair in (meta(pod).get("labels") or {}).items():
            self._by_label[pair].discard(uid)
            if not self._by_label[pair]:
                del self._by_label[pair]
        for i, bucket in enumerate(self._anti_of.pop(uid, [])):
            self._anti[bucket].discard((uid, i))

    def node_of(self, uid: str) -> str | None:
        return self._node_of.get(uid)

    def domain(self, node: Obj, key: str) -> str | None:
        return (meta(node).get("labels") or {}).get(key)

    def matching(self, selector: Obj | None) -> list[tuple[Obj, str]]:
        """(pod, node) for the placed pods whose labels the label selector picks (None picks nothing)."""
        if selector is None:
            return []
        pairs = _pairs(selector)
        if pairs:
            uids = min((self._by_label.get(p) or set() for p in pairs), key=len)
        else:  # only matchExpressions, or {}: every pod is a candidate
            uids = set(self._node_of)
        out = []
        for uid in uids:
            node = self._node_of[uid]
            pod = self.on[node][uid]
            self.visited += 1
            if selector_matches(selector, meta(pod).get("labels") or {}):
                out.append((pod, node))
        return out

    def selected(self, term: Obj, owner: Obj, key: str, value: str) -> list[Obj]:
        """Pods other than owner that owner's affinity term selects, on nodes whose label `key` is `value`."""
        return [
            p
            for p, node in self.matching(term.get("labelSelector"))
            if node in self.nodes
            and self.domain(self.nodes[node], key) == value
            and _uid(p) != _uid(owner)
            and _term_selects(term, owner, p)
        ]

    def anti_terms_against(self, pod: Obj) -> list[tuple[Obj, str, Obj]]:
        """(other pod, its node, its required anti-affinity term) for the terms that may select `pod`."""
        refs = set(self._anti.get(None) or ())
        for pair in (meta(pod).get("labels") or {}).items():
            refs |= self._anti.get(pair) or set()
        out = []
        for uid, i in sorted(refs):
            node = self._node_of[uid]
            other = self.on[node][uid]
            self.visited += 1
            out.append((other, node, _affinity(other, "podAntiAffinity", "required")[i]))
        return out


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


# --- filters ----------------------------------------------------------------------------------------------------
def inter_pod_filter(pod: Obj, node: Obj, placed: Placed) -> str | None:
    """None when `pod` may go to `node` by the pod (anti-)affinity and topology spread rules, else the reason."""
    for term in _affinity(pod, "podAntiAffinity", "required"):
        value = placed.domain(node, term.get("topologyKey", ""))
        if value is not None and placed.selected(term, pod, term["topologyKey"], value):
            return POD_ANTI_AFFINITY
    for other, name, term in placed.anti_terms_against(pod):  # existing pods' required anti-affinity
        there = placed.nodes.get(name)
        if there is None or _uid(other) == _uid(pod):
            continue
        key = term.get("topologyKey", "")
        same = placed.domain(node, key) is not None and placed.domain(node, key) == placed.domain(there, key)
        if same and _term_selects(term, other, pod):
            return EXISTING_ANTI_AFFINITY
    for term in _affinity(pod, "podAffinity", "required"):
        key = term.get("topologyKey", "")
        value = placed.domain(node, key)
        anywhere = [
            p
            for p, on in placed.matching(term.get("labelSelector"))
            if on in placed.nodes and _uid(p) != _uid(pod) and _term_selects(term, pod, p)
        ]
        here = value is not None and bool(placed.selected(term, pod, key, value))
        # The first pod of a group that selects itself may go anywhere (kube-scheduler's rule).
        if not here and (anywhere or not _term_selects(term, pod, pod) or value is None):
            return POD_AFFINITY
    return _spread_filter(pod, node, placed)


def _spread_counts(pod: Obj, constraint: Obj, placed: Placed, eligible: list[Obj]) -> dict[str, int]:
    """Matching pods per domain of the constraint's topology key, over the eligible nodes."""
    key = constraint.get("topologyKey", "")
    domain_of = {meta(n)["name"]: placed.domain(n, key) for n in eligible}
    counts = {value: 0 for value in domain_of.values() if value is not None}
    ns = meta(pod).get("namespace", "default")
    for p, name in placed.matching(constraint.get("labelSelector")):
        value = domain_of.get(name)
        if value is not None and _uid(p) != _uid(pod) and meta(p).get("namespace", "default") == ns:
            counts[value] += 1
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
            near = placed.selected(term, pod, term["topologyKey"], value)
            penalty += sign * int(weighted.get("weight", 1)) * len(near)
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
