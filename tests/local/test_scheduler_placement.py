"""The local scheduler's decisions (scheduler.choose_node), as a table: the rules ftjob renders (docs/scheduling.md)
and kube-scheduler applies: pod anti-affinity and affinity on the hostname, topology spread constraints, taints and
tolerations, cordoned and NotReady nodes, matchFields on the node's name; then ftjob's own rendered worker pods."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest
from ftjob_local.objects import RESOURCES
from ftjob_local.placement import (
    EXISTING_ANTI_AFFINITY,
    POD_AFFINITY,
    POD_ANTI_AFFINITY,
    SPREAD,
    SPREAD_MISSING_LABEL,
    Placed,
)
from ftjob_local.scheduler import choose_node

HOST = "kubernetes.io/hostname"
JOB = {"ftjob.dev/job-name": "tj", "ftjob.dev/role": "worker", "ftjob.dev/restart-generation": "0"}
TERM = {"labelSelector": {"matchLabels": JOB}, "topologyKey": HOST}
REQUIRED_ANTI = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}}
PREFERRED_ANTI = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": TERM}]
    }
}
SPREAD_HOSTS = [
    {
        "maxSkew": 1,
        "topologyKey": HOST,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": TERM["labelSelector"],
    }
]
SELECTOR = "node(s) didn't match Pod's node affinity/selector"


def node(name, *, taints=(), cordoned=False, ready=True, labels=None, hostname=True):
    lab = {**({HOST: name} if hostname else {}), **(labels or {})}
    return {
        "metadata": {"name": name, "labels": lab},
        "spec": {"taints": list(taints), **({"unschedulable": True} if cordoned else {})},
        "status": {
            "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "10"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(name, *, labels=JOB, affinity=None, spread=None, tolerations=None, selector=None, namespace="ns"):
    spec = {"containers": [{"name": "c"}]}
    for key, value in (
        ("affinity", affinity),
        ("topologySpreadConstraints", spread),
        ("tolerations", tolerations),
        ("nodeSelector", selector),
    ):
        if value:
            spec[key] = value
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": name, "labels": dict(labels)},
        "spec": spec,
    }


def taint(key, effect="NoSchedule"):
    return {"key": key, "value": "true", "effect": effect}


def avoid(*names):
    term = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": list(names)}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def anti_by_expressions(*exprs):
    """Required anti-affinity on the job's workers, with extra matchExpressions in its selector."""
    selector = {
        "matchLabels": {"ftjob.dev/job-name": "tj"},
        "matchExpressions": [
            {"key": "ftjob.dev/role", "operator": "Exists"},
            *({"key": k, "operator": op, "values": v} for k, op, v in exprs),
        ],
    }
    term = {"labelSelector": selector, "topologyKey": HOST}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def node_terms(*terms):
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def NAME_IN(*names):  # noqa: N802 - reads as the selector it builds
    return {"key": "metadata.name", "operator": "In", "values": list(names)}


def not_spot_and_avoid(*names):
    """The example's coordinator affinity (not on spot nodes) after the operator added the nodes to avoid."""
    from ftjob_operator.placement import pod_affinity

    user = node_terms(
        {"matchExpressions": [{"key": "ftjob.dev/spot", "operator": "NotIn", "values": ["true"]}]}
    )
    return pod_affinity(user, avoid_nodes=names)


def decide(incoming, nodes, placed_pods=()):
    """choose_node over `nodes` with `placed_pods` given as (pod, node name) pairs."""
    placed = Placed({n["metadata"]["name"]: n for n in nodes})
    for p, where in placed_pods:
        placed.add(p, where)
    used = {name: {r: Decimal(0) for r in RESOURCES} for name in placed.nodes}
    return choose_node(incoming, placed, used)


OTHER_GEN = {**JOB, "ftjob.dev/restart-generation": "1"}
CASES = {
    # spec.scheduling.spread: Required
    "required anti-affinity: the free node": (
        pod("w2", affinity=REQUIRED_ANTI),
        [node("a"), node("b")],
        [(pod("w1"), "a")],
        "b",
        {POD_ANTI_AFFINITY: 1},
    ),
    "required anti-affinity: no free node, wait": (
        pod("w3", affinity=REQUIRED_ANTI),
        [node("a"), node("b")],
        [(pod("w1"), "a"), (pod("w2"), "b")],
        None,
        {POD_ANTI_AFFINITY: 2},
    ),
    "an older generation's pod does not count": (
        pod("w2", affinity=REQUIRED_ANTI),
        [node("a")],
        [(pod("w1", labels=OTHER_GEN), "a")],
        "a",
        {},
    ),
    "another namespace's pod does not count": (
        pod("w2", affinity=REQUIRED_ANTI),
        [node("a")],
        [(pod("w1", namespace="other"), "a")],
        "a",
        {},
    ),
    "a node without the topology label does not conflict": (
        pod("w2", affinity=REQUIRED_ANTI),
        [node("a", hostname=False)],
        [(pod("w1"), "a")],
        "a",
        {},
    ),
    "an existing pod's required anti-affinity refuses the newcomer": (
        pod("w2"),
        [node("a")],
        [(pod("w1", affinity=REQUIRED_ANTI), "a")],
        None,
        {EXISTING_ANTI_AFFINITY: 1},
    ),
    "a selector's matchExpressions: In and Exists select the peer": (
        pod("w2", affinity=anti_by_expressions(("ftjob.dev/restart-generation", "In", ["0", "1"]))),
        [node("a"), node("b")],
        [(pod("w1"), "a")],
        "b",
        {POD_ANTI_AFFINITY: 1},
    ),
    "a selector's matchExpressions: NotIn leaves that generation out": (
        pod("w2", affinity=anti_by_expressions(("ftjob.dev/restart-generation", "NotIn", ["0"]))),
        [node("a")],
        [(pod("w1"), "a")],
        "a",
        {},
    ),
    "a selector's matchExpressions: DoesNotExist": (
        pod("w2", affinity=anti_by_expressions(("ftjob.dev/spare", "DoesNotExist", []))),
        [node("a"), node("b")],
        [(pod("w1"), "a"), (pod("s1", labels={**JOB, "ftjob.dev/spare": "true"}), "b")],
        "b",
        {POD_ANTI_AFFINITY: 1},
    ),
    # Preferred: spread while nodes allow, then share
    "preferred anti-affinity: the node without a peer, though it has more pods": (
        pod("w2", affinity=PREFERRED_ANTI),
        [node("a"), node("b")],
        [(pod("w1"), "a"), (pod("x", labels={"app": "x"}), "b"), (pod("y", labels={"app": "y"}), "b")],
        "b",
        {},
    ),
    "preferred anti-affinity: shares when every node has a peer": (
        pod("w3", affinity=PREFERRED_ANTI),
        [node("a"), node("b")],
        [(pod("w1"), "a"), (pod("w2"), "b")],
        "a",
        {},
    ),
    # required pod affinity (the first pod of a group that selects itself may go anywhere)
    "required pod affinity: next to its peer": (
        pod("w2", affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}}),
        [node("a"), node("b")],
        [(pod("w1"), "b")],
        "b",
        {POD_AFFINITY: 1},
    ),
    "required pod affinity: the first of its group": (
        pod("w1", affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}}),
        [node("a")],
        [],
        "a",
        {},
    ),
    "required pod affinity: nothing it selects anywhere, and it does not select itself": (
        pod(
            "w1",
            labels={"app": "x"},
            affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}},
        ),
        [node("a")],
        [],
        None,
        {POD_AFFINITY: 1},
    ),
    # topology spread constraints
    "spread DoNotSchedule: the emptier domain": (
        pod("w2", spread=SPREAD_HOSTS),
        [node("a"), node("b")],
        [(pod("w1"), "a")],
        "b",
        {SPREAD: 1},
    ),
    "spread DoNotSchedule: skew 2 refused": (
        pod("w2", spread=SPREAD_HOSTS),
        [node("a"), node("b", taints=[taint("x")])],
        [(pod("w1"), "a")],
        None,
        {SPREAD: 1, "node(s) had untolerated taint {x: true}": 1},
    ),
    "spread counts only nodes the pod may use (nodeSelector)": (
        pod("w2", spread=SPREAD_HOSTS, selector={"pool": "spot"}),
        [node("a", labels={"pool": "spot"}), node("b")],
        [(pod("w1"), "a")],
        "a",
        {SELECTOR: 1},
    ),
    "spread: a node without the key": (
        pod("w1", spread=SPREAD_HOSTS),
        [node("a", hostname=False)],
        [],
        None,
        {SPREAD_MISSING_LABEL: 1},
    ),
    "spread ScheduleAnyway only scores": (
        pod("w3", spread=[{**SPREAD_HOSTS[0], "whenUnsatisfiable": "ScheduleAnyway"}]),
        [node("a"), node("b")],
        [(pod("w1"), "a"), (pod("w2"), "a")],
        "b",
        {},
    ),
    # taints, cordons, readiness, names
    "NoSchedule taint refused": (
        pod("w1"),
        [node("a", taints=[taint("aws-node-termination-handler/spot-itn")])],
        [],
        None,
        {"node(s) had untolerated taint {aws-node-termination-handler/spot-itn: true}": 1},
    ),
    "NoExecute taint refused": (
        pod("w1"),
        [node("a", taints=[taint("node.kubernetes.io/out-of-service", "NoExecute")])],
        [],
        None,
        {"node(s) had untolerated taint {node.kubernetes.io/out-of-service: true}": 1},
    ),
    "a tolerated taint is fine": (
        pod("w1", tolerations=[{"key": "gpu", "operator": "Exists"}]),
        [node("a", taints=[taint("gpu")])],
        [],
        "a",
        {},
    ),
    "PreferNoSchedule only ranks lower": (
        pod("w1"),
        [node("a", taints=[taint("r", "PreferNoSchedule")]), node("b")],
        [(pod("x", labels={}), "b")],
        "b",
        {},
    ),
    "PreferNoSchedule alone is still a place": (
        pod("w1"),
        [node("a", taints=[taint("r", "PreferNoSchedule")])],
        [],
        "a",
        {},
    ),
    "cordoned refused": (pod("w1"), [node("a", cordoned=True)], [], None, {"node(s) were unschedulable": 1}),
    "cordoned, for a pod that tolerates everything (kube-scheduler's rule)": (
        pod("w1", tolerations=[{"operator": "Exists"}]),
        [node("a", cordoned=True)],
        [],
        "a",
        {},
    ),
    "the operator's exclusion by name holds against a blanket toleration": (
        pod("w1", tolerations=[{"operator": "Exists"}], affinity=avoid("a")),
        [node("a", cordoned=True), node("b")],
        [(pod("x", labels={}), "b")],
        "b",
        {SELECTOR: 1},
    ),
    "the user's matchExpressions and the operator's matchFields in one term: both hold": (
        pod("c1", affinity=not_spot_and_avoid("a")),
        [node("a"), node("b", labels={"ftjob.dev/spot": "true"}), node("c")],
        [],
        "c",
        {SELECTOR: 2},
    ),
    "node selector terms are ORed": (
        pod("c1", affinity=node_terms({"matchFields": [NAME_IN("b")]}, {"matchFields": [NAME_IN("c")]})),
        [node("a"), node("b"), node("c")],
        [(pod("x", labels={}), "b")],
        "c",
        {SELECTOR: 1},
    ),
    "node affinity Gt on a numeric label": (
        pod(
            "c1",
            affinity=node_terms({"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]}),
        ),
        [node("a", labels={"gpus": "4"}), node("b", labels={"gpus": "8"}), node("c")],
        [],
        "b",
        {SELECTOR: 2},
    ),
    "excluded by name, nowhere else": (
        pod("w1", affinity=avoid("a")),
        [node("a")],
        [],
        None,
        {SELECTOR: 1},
    ),
    "NotReady is no place to bind": (
        pod("w1"),
        [node("a", ready=False)],
        [],
        None,
        {"node(s) were not ready": 1},
    ),
}


@pytest.mark.parametrize("incoming,nodes,placed,expected,reasons", CASES.values(), ids=CASES.keys())
def test_choose_node(incoming, nodes, placed, expected, reasons):
    """`reasons`: how many nodes refused the pod, per reason (also when another node took it)."""
    target, why = decide(incoming, nodes, placed)
    assert (target, why) == (expected, Counter(reasons))


def test_the_operators_rendered_workers_go_to_distinct_nodes_and_wait_for_a_free_one():
    from ftjob_operator import api, render

    ref = render.JobRef(name="tj", namespace="ns", uid="u")
    spec = api.parse_spec({"image": "i", "workers": {"min": 1, "max": 2}})

    def worker(index, avoid_nodes=()):
        p = render.render_worker_pod(
            ref, spec, index=index, generation=0, coordinator_ip="10.0.0.1", avoid_nodes=list(avoid_nodes)
        )
        p["metadata"]["uid"] = f"u{index}"
        return p

    nodes = [node("spot-0"), node("spot-1")]
    first, _ = decide(worker(1), nodes)
    second, _ = decide(worker(2), nodes, [(worker(1), first)])
    assert {first, second} == {"spot-0", "spot-1"}
    # spot-1 is gone; its replacement does not double up beside the survivor, and waits
    assert decide(worker(3), [node("spot-0")], [(worker(1), "spot-0")]) == (
        None,
        Counter({POD_ANTI_AFFINITY: 1}),
    )
    # a new node comes, but one that carries a termination notice is excluded by name (PreferNoSchedule here)
    rebalance = node(
        "spot-2", taints=[taint("aws-node-termination-handler/rebalance-recommendation", "PreferNoSchedule")]
    )
    got = decide(worker(3, ["spot-2"]), [node("spot-0"), rebalance, node("spot-3")], [(worker(1), "spot-0")])
    assert got == ("spot-3", Counter({POD_ANTI_AFFINITY: 1, SELECTOR: 1}))
