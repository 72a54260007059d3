"""Where a job's pods may go (placement.py): spec.scheduling.spread as pod anti-affinity, nodes going away
excluded by name, the user's own affinity kept; and the planner's part (issue 14: spread and drain awareness)."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from ftjob_operator import api, placement, render
from ftjob_operator.planner import Observed, plan
from tj_builders import NOW, UID, Store, converge, healthy_status, job, pod, pods_created, service

REF = render.JobRef(name="tj", namespace="ns", uid=UID)
PEERS = {"ftjob.dev/job-name": "tj", "ftjob.dev/role": "worker", "ftjob.dev/restart-generation": "2"}
TERM = {"labelSelector": {"matchLabels": PEERS}, "topologyKey": "kubernetes.io/hostname"}
USER_NODE_TERM = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
USER_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [USER_NODE_TERM]}
    },
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
        ]
    },
}


def worker(spread: str | None = None, affinity: dict | None = None, avoid: tuple[str, ...] = ()) -> dict:
    scheduling: dict = {"workers": {"affinity": copy.deepcopy(affinity)} if affinity else {}}
    if spread:
        scheduling["spread"] = spread
    s = api.parse_spec(job(scheduling=scheduling)["spec"])
    return render.render_worker_pod(
        REF, s, index=3, generation=2, coordinator_ip="10.96.0.7", avoid_nodes=list(avoid)
    )


# --- the rendered affinity, for each spec.scheduling.spread ------------------------------------------------------
@pytest.mark.parametrize(
    "spread,expected",
    [
        (
            None,
            {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}},
        ),  # the default
        ("Required", {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}}),
        (
            "Preferred",
            {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "podAffinityTerm": TERM}
                    ]
                }
            },
        ),
        ("None", None),
    ],
)
def test_spread_renders_anti_affinity_among_the_generations_workers(spread, expected):
    pod_ = worker(spread)
    assert pod_["spec"].get("affinity") == expected
    # the term selects exactly this generation's workers of this job: the pod itself carries every label
    assert all(pod_["metadata"]["labels"][k] == v for k, v in PEERS.items())
    kubernetes_validate.validate(pod_, "1.32", strict=True)


@pytest.mark.parametrize("spread", ["Required", "Preferred", "None"])
def test_the_users_affinity_is_kept_and_ours_added_beside_it(spread):
    pod_ = worker(spread, affinity=USER_AFFINITY, avoid=("node-b", "node-a"))
    affinity = pod_["spec"]["affinity"]
    anti = affinity["podAntiAffinity"]
    assert (
        anti["requiredDuringSchedulingIgnoredDuringExecution"][0]
        == (USER_AFFINITY["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0])
    )
    ours = {
        "Required": anti["requiredDuringSchedulingIgnoredDuringExecution"][1:],
        "Preferred": [
            t["podAffinityTerm"] for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        ],
        "None": anti["requiredDuringSchedulingIgnoredDuringExecution"][1:],
    }[spread]
    assert ours == ([] if spread == "None" else [TERM])
    # the nodes to avoid join the user's own term (terms are ORed: each gets the exclusion), sorted
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {
        **USER_NODE_TERM,
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-a", "node-b"]}],
    }
    kubernetes_validate.validate(pod_, "1.32", strict=True)
    assert USER_AFFINITY["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] == [USER_NODE_TERM], "the spec's own affinity must not be changed in place"


def test_every_ored_node_term_gets_the_exclusion_and_none_is_added_without_nodes():
    two = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}, {}]}}
    }
    got = placement.pod_affinity(two, avoid_nodes=["n1"])
    terms = got["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchFields"][0]["values"] for t in terms] == [["n1"], ["n1"]]
    assert placement.pod_affinity(None) is None
    assert placement.pod_affinity(None, avoid_nodes=[]) is None
    alone = placement.pod_affinity(None, avoid_nodes=["n1"])
    assert alone == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}
                ]
            }
        }
    }


def test_the_coordinator_avoids_nodes_but_has_no_spread_term():
    s = api.parse_spec(job()["spec"])
    c = render.render_coordinator_pod(REF, s, index=0, generation=0, avoid_nodes=["gone"])
    assert "podAntiAffinity" not in c["spec"]["affinity"]
    assert render.render_coordinator_pod(REF, s, index=0, generation=0)["spec"].get("affinity") is None


def test_spread_is_validated_and_changing_it_is_a_template_change():
    with pytest.raises(ValueError):
        api.parse_spec(job(scheduling={"spread": "Sometimes"})["spec"])
    required = api.parse_spec(job()["spec"])
    relaxed = api.parse_spec(job(scheduling={"spread": "Preferred"})["spec"])
    assert required.scheduling.spread == "Required"
    assert render.template_hash(REF, required) != render.template_hash(REF, relaxed)
    # the nodes a replacement avoids are per pod, not the template's
    assert render.template_hash(REF, required) == render.template_hash(REF, api.parse_spec(job()["spec"]))


# --- the planner ------------------------------------------------------------------------------------------------
def node(name: str, *, taints: list[dict] | None = None, cordoned: bool = False, ready: bool = True) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"taints": taints or [], **({"unschedulable": True} if cordoned else {})},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def taint(key: str, effect: str = "NoSchedule") -> dict:
    return {"key": key, "value": "true", "effect": effect}


def avoided(manifest: dict) -> list[str]:
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return terms["nodeSelectorTerms"][0]["matchFields"][0]["values"]


def test_a_replacement_avoids_nodes_going_away_or_being_drained():
    nodes = [
        node("fine"),
        node("not-ready", ready=False),  # may come back: left to the scheduler (it refuses NotReady nodes)
        node(
            "rebalance",
            taints=[taint("aws-node-termination-handler/rebalance-recommendation", "PreferNoSchedule")],
        ),
        node("spot", taints=[taint("aws-node-termination-handler/spot-itn")]),
        node("oos", taints=[taint("node.kubernetes.io/out-of-service", "NoExecute")]),
        node("cordoned", cordoned=True),
        node("extra", taints=[taint("example.com/going", "PreferNoSchedule")]),
        node("other-taint", taints=[taint("nvidia.com/gpu")]),
    ]
    obs = Observed(
        job=job(status=healthy_status()),
        pods=[pod("coordinator", 0, node="fine"), pod("worker", 1, node="fine")],  # tj-worker-2 vanished
        nodes=nodes,
        service=service(),
        secret_exists=True,
        new_token="t",
        extra_termination_taints=frozenset({"example.com/going"}),
    )
    p = plan(obs, NOW)
    (replacement,) = [a.manifest for a in p.actions if getattr(a, "kind", None) == "Pod"]
    assert avoided(replacement) == ["cordoned", "extra", "oos", "rebalance", "spot"]
    assert replacement["spec"]["affinity"]["podAntiAffinity"]  # and it keeps off its peers' nodes


def test_an_unschedulable_replacement_is_no_failure_and_an_elastic_job_trains_on_at_min():
    store = Store(job(workers={"min": 1, "max": 2}))
    converge(store, NOW)
    # worker-2's node is lost; its replacement finds no node without a peer and stays Pending (Unschedulable)
    del store.pods["tj-worker-2"]
    store.schedule_to = None
    converge(store, NOW)
    (waiting,) = [n for n, p in store.pods.items() if p["spec"]["nodeName"] is None]
    store.pods[waiting]["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes..."}
        ],
    }
    p = converge(store, NOW)
    st = store.status
    assert (st["preemptions"], st.get("failures", 0)) == (1, 0), st
    assert st["phase"] == "Running" and st["workers"]["ready"] == 1, st
    assert pods_created(p) == [] and waiting in store.pods, (
        "a waiting replacement is neither replaced nor deleted"
    )


def test_a_worker_on_a_not_ready_node_is_not_counted_ready():
    store = Store(job(workers={"min": 2, "max": 2}))
    converge(store, NOW)
    assert store.status["workers"]["ready"] == 2
    store.nodes = [node("node-a", ready=False), node("node-b")]  # every pod of the Store runs on node-a
    p = plan(store.observe(), NOW)
    assert p.status["workers"]["ready"] == 0 and p.status["workers"]["active"] == 2, p.status["workers"]
    assert pods_created(p) == [], "a node that stops reporting is not a lost pod: it may come back"
