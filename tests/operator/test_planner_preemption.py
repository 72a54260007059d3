"""The preemption policy: what counts as a preemption, counted once, never against the failure budget; the
limit; the termination notice."""

from __future__ import annotations

import json

import pytest
from ftjob_operator import conditions as cond
from ftjob_operator.planner import Create, Event, Observed, RequestCheckpoint, plan, preemption
from ftjob_operator.planner.context import Context
from ftjob_operator.planner.observed import Nodes
from ftjob_trainer import contract
from tj_builders import (
    NOW,
    at,
    condition,
    converge,
    healthy_status,
    job,
    node,
    pod,
    pods_created,
    reasons,
    running_observed,
    started,
    with_book,
)


def _preempted_worker(variant: str) -> tuple[list[dict], list[dict]]:
    nodes = [node("node-a"), node("node-b")]
    w = {
        "disruption target, terminating": pod(
            "worker", 2, node="node-b", deleting=True, disruption="TerminationByKubelet"
        ),
        "node gone": pod("worker", 2, node="node-gone"),
        "spot taint then SIGTERM exit": pod("worker", 2, node="node-b", exit_code=143),
        "evicted": pod("worker", 2, node="node-b", phase="Failed", status_reason="Evicted", ready=False),
        "deleted while running": pod("worker", 2, node="node-b", deleting=True),
        "container lost by the runtime": pod(
            "worker", 2, node="node-b", exit_code=137, term_reason="ContainerStatusUnknown"
        ),
        "trainer says preempted": pod(
            "worker",
            2,
            node="node-b",
            exit_code=1,
            term_message=json.dumps({"reason": "preempted", "step": 7}),
        ),
    }[variant]
    if variant == "spot taint then SIGTERM exit":
        nodes = [node("node-a"), node("node-b", "aws-node-termination-handler/spot-itn")]
    return [pod("coordinator", 0), pod("worker", 1), w], nodes


@pytest.mark.parametrize(
    "variant",
    [
        "disruption target, terminating",
        "node gone",
        "spot taint then SIGTERM exit",
        "evicted",
        "deleted while running",
        "container lost by the runtime",
        "trainer says preempted",
    ],
)
def test_preempted_worker_is_counted_once_and_replaced_at_once(variant):
    pods, nodes = _preempted_worker(variant)
    status = healthy_status()
    obs = running_observed(job(status=status), pods=pods, nodes=nodes)
    p = plan(obs, NOW)
    assert (p.status["preemptions"], p.status["failures"], p.status["operator"]["restartGeneration"]) == (
        1,
        0,
        0,
    )
    assert pods_created(p) == ["tj-worker-3"], "the replacement must not wait for the old pod to terminate"
    assert "Preempted" in reasons(p) and "Replaced" in reasons(p)
    assert condition(p.status, "Preempted")["status"] == "True"
    # Operator restart: the same observations with the persisted status count nothing twice and create nothing new.
    created = dict(obs.__dict__, job=job(status=p.status))
    again = plan(Observed(**created), at(1))
    assert again.status["preemptions"] == 1
    assert pods_created(again) == ["tj-worker-3"]  # the same name re-issued (409), not a new pod


def test_a_known_pod_that_vanished_counts_as_a_preemption():
    status = healthy_status()
    obs = running_observed(job(status=status), pods=[pod("coordinator", 0), pod("worker", 1)])
    p = plan(obs, NOW)
    assert p.status["preemptions"] == 1 and pods_created(p) == ["tj-worker-3"]


def test_preemptions_never_use_the_failure_budget():
    store = started(failurePolicy={"maxFailures": 0})
    for i in range(5):
        store.preempt(store.names("worker")[0])
        converge(store, at(10 * i))
        store.finish_terminating()
        converge(store, at(10 * i + 1))
    assert (store.status["preemptions"], store.status["failures"]) == (5, 0)
    assert store.status["phase"] == "Running" and len(store.names("worker")) == 2
    assert condition(store.status, "Preempted")["status"] == "False"  # recovered


def test_max_preemptions_fails_the_job():
    store = started(preemption={"maxPreemptions": 1})
    for name in store.names("worker"):
        store.preempt(name)
    p = converge(store, NOW)
    assert store.status["phase"] == "Failed"
    assert condition(store.status, "Failed")["reason"] == cond.REASON_PREEMPTION_LIMIT
    assert not p.of(Create)


def test_termination_notice_requests_one_checkpoint_before_the_sigterm():
    store = started()
    store.nodes[0]["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]
    p = plan(store.observe(), NOW)
    assert [a.reason for a in p.of(RequestCheckpoint)] == [
        "termination notice: node node-a tainted ToBeDeletedByClusterAutoscaler"
    ]
    store.apply(p)
    assert plan(store.observe(), at(1)).of(RequestCheckpoint) == []  # asked once


def test_notice_is_not_acted_on_when_checkpoint_on_notice_is_off():
    store = started(preemption={"checkpointOnNotice": False})
    store.pods[store.names("worker")[0]]["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    assert plan(store.observe(), NOW).of(RequestCheckpoint) == []


def test_a_preempted_coordinator_counts_as_a_preemption():
    store = started()
    store.preempt("tj-coordinator-0")
    p = plan(store.observe(), NOW)
    assert (p.status["preemptions"], p.status["failures"]) == (1, 0)
    assert "tj-coordinator-3" in pods_created(p)


# --- the evidence, one row per rule (preemption.evidence) -------------------------------------------------------
SPOT = "aws-node-termination-handler/spot-itn"
EVIDENCE = {
    # name: (the lost pod, the nodes, pods whose notice was seen earlier, the words, or None for a failure)
    "disruption target": (
        pod("worker", 1, deleting=True, disruption="TerminationByKubelet"),
        [node("node-a")],
        set(),
        "DisruptionTarget (TerminationByKubelet)",
    ),
    "termination taint": (
        pod("worker", 1, exit_code=1),
        [node("node-a", SPOT)],
        set(),
        f"node node-a tainted {SPOT}",
    ),
    "notice seen earlier": (
        pod("worker", 1, exit_code=1),
        [node("node-a")],
        {"tj-worker-1"},
        "termination notice seen earlier",
    ),
    "node gone": (pod("worker", 1, node="node-gone"), [node("node-a")], set(), "node node-gone is gone"),
    "evicted": (
        pod("worker", 1, phase="Failed", status_reason="Evicted", ready=False),
        [node("node-a")],
        set(),
        "pod Evicted:",
    ),
    "rejected by a restarted kubelet (device plugin not back)": (
        pod("worker", 1, phase="Failed", status_reason="UnexpectedAdmissionError", ready=False),
        [node("node-a")],
        set(),
        "pod UnexpectedAdmissionError:",
    ),
    "rejected by a restarted kubelet (no room)": (
        pod("worker", 1, phase="Failed", status_reason="OutOfcpu", ready=False),
        [node("node-a")],
        set(),
        "pod OutOfcpu:",
    ),
    "container lost by the runtime": (
        pod("worker", 1, exit_code=137, term_reason="ContainerStatusUnknown"),
        [node("node-a")],
        set(),
        "container ContainerStatusUnknown: the platform lost it (exit code 137)",
    ),
    "trainer preempted": (
        pod("worker", 1, exit_code=1, term_message=json.dumps({"reason": contract.REASON_PREEMPTED})),
        [node("node-a")],
        set(),
        f"trainer stopped: {contract.REASON_PREEMPTED}",
    ),
    "trainer stopped with a peer": (
        pod("worker", 1, exit_code=1, term_message=json.dumps({"reason": contract.REASON_PEER})),
        [node("node-a")],
        set(),
        f"trainer stopped: {contract.REASON_PEER}",
    ),
    "save skipped at the deadline": (
        pod("worker", 1, exit_code=1, term_message=json.dumps({"reason": contract.REASON_DEADLINE})),
        [node("node-a")],
        set(),
        f"trainer stopped: {contract.REASON_DEADLINE}",
    ),
    "deleted while running": (
        pod("worker", 1, deleting=True),
        [node("node-a")],
        set(),
        "deleted while running (not by ftjob)",
    ),
    "deleted, SIGTERM exit": (
        pod("worker", 1, deleting=True, exit_code=143),
        [node("node-a")],
        set(),
        "deleted, exit code 143",
    ),
    "deleted, SIGKILL exit": (
        pod("worker", 1, deleting=True, exit_code=137),
        [node("node-a")],
        set(),
        "deleted, exit code 137",
    ),
    # failures: nothing outside the pod stopped it
    "error exit": (pod("worker", 1, exit_code=1), [node("node-a")], set(), None),
    "OOM kill, not deleted": (
        pod("worker", 1, exit_code=137, term_reason="OOMKilled"),
        [node("node-a")],
        set(),
        None,
    ),
    "deleted after an error exit": (
        pod("worker", 1, deleting=True, exit_code=1),
        [node("node-a")],
        set(),
        None,
    ),
    "trainer error": (
        pod("worker", 1, exit_code=1, term_message=json.dumps({"reason": contract.REASON_ERROR})),
        [node("node-a")],
        set(),
        None,
    ),
    "image pull": (pod("worker", 1, waiting="ImagePullBackOff"), [node("node-a")], set(), None),
    "no node view": (pod("worker", 1, node="node-gone", exit_code=1), None, set(), None),
    "a taint that is no notice": (
        pod("worker", 1, exit_code=1),
        [node("node-a", "example.com/gpu")],
        set(),
        None,
    ),
}


@pytest.mark.parametrize("row", list(EVIDENCE))
def test_evidence_of_a_preemption(row):
    lost, nodes, noticed, words = EVIDENCE[row]
    assert preemption.evidence(lost, Nodes(nodes), noticed) == words


def test_a_notice_is_a_disruption_target_or_a_termination_taint_on_the_pods_node():
    nodes = Nodes([node("node-a", "ToBeDeletedByClusterAutoscaler"), node("node-b")])
    assert (
        preemption.notice_of(pod("worker", 1), nodes) == "node node-a tainted ToBeDeletedByClusterAutoscaler"
    )
    assert preemption.notice_of(pod("worker", 1, node="node-b"), nodes) is None
    disrupted = pod("worker", 1, node="node-b", disruption="PreemptionByScheduler")
    assert preemption.notice_of(disrupted, nodes) == "DisruptionTarget (PreemptionByScheduler)"
    for key in preemption.TERMINATION_TAINTS:
        assert (
            preemption.notice_of(pod("worker", 1), Nodes([node("node-a", key)]))
            == f"node node-a tainted {key}"
        )


def test_counting_a_preemption_sets_the_counter_its_time_the_condition_and_a_warning():
    ctx = Context(running_observed(job(status=dict(healthy_status(), preemptions=2))), NOW)
    preemption.count(ctx, "tj-worker-1", "worker", "node node-a is gone")
    assert (ctx.st.preemptions, ctx.st.operator.last_preemption_time) == (3, "2026-01-01T12:00:00Z")
    assert condition({"conditions": ctx.conds}, "Preempted") == {
        "type": "Preempted",
        "status": "True",
        "reason": "Preempted",
        "message": "tj-worker-1: node node-a is gone",
        "lastTransitionTime": "2026-01-01T12:00:00Z",
        "observedGeneration": 1,
    }
    assert ctx.events == [Event("Warning", "Preempted", "worker tj-worker-1 preempted: node node-a is gone")]


@pytest.mark.parametrize("seconds,soon", [(0, True), (60, True), (61, False)])
def test_trainer_errors_are_a_preemptions_consequence_for_a_minute(seconds, soon):
    st = with_book(healthy_status(), lastPreemptionTime="2026-01-01T12:00:00Z")
    assert preemption.soon_after_a_preemption(Context(running_observed(job(status=st)), at(seconds))) is soon
    assert not preemption.soon_after_a_preemption(
        Context(running_observed(job(status=healthy_status())), NOW)
    )


def test_extra_termination_taints_from_the_operators_settings_count_as_a_notice(monkeypatch):
    from ftjob_operator import handlers

    monkeypatch.setenv(handlers.EXTRA_TAINTS_ENV, " example.com/going-away ,, other.io/drain")
    extra = handlers.extra_taints_from_env()
    assert extra == {"example.com/going-away", "other.io/drain"}
    tainted = [node("node-a", "example.com/going-away")]
    assert preemption.notice_of(pod("worker", 1), Nodes(tainted, extra)) == (
        "node node-a tainted example.com/going-away"
    )
    assert preemption.notice_of(pod("worker", 1), Nodes(tainted)) is None  # not a built-in key
    monkeypatch.delenv(handlers.EXTRA_TAINTS_ENV)
    assert handlers.extra_taints_from_env() == frozenset()
