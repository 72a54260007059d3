"""The children: what a pass creates and deletes (Secret, NetworkPolicy, Service, coordinator, workers; scale;
deferred deletes)."""

from __future__ import annotations

import pytest
from ftjob_operator.network_policy import OperatorPods
from ftjob_operator.planner import Create, Delete, Observed, plan
from ftjob_trainer import contract
from tj_builders import (
    NOW,
    Store,
    at,
    condition,
    converge,
    job,
    node,
    pods_created,
    reasons,
    service,
    started,
)


def test_first_pass_creates_secret_and_service_then_pods_once_the_service_has_an_ip():
    first = plan(Observed(job=job(), new_token="t0ken"), NOW)
    assert sorted(a.kind for a in first.of(Create)) == ["Secret", "Service"]
    assert first.requeue_after is not None

    obs = Observed(job=job(status=first.status), service=service(), secret_exists=True, new_token="x")
    second = plan(obs, NOW)
    assert pods_created(second) == ["tj-coordinator-0", "tj-worker-1", "tj-worker-2"]
    assert second.status["operator"]["pendingPods"] == ["tj-coordinator-0", "tj-worker-1", "tj-worker-2"]
    assert condition(second.status, "Created")["status"] == "True"
    assert second.status["startTime"] == "2026-01-01T12:00:00Z"
    assert "Created" in reasons(second)


def test_the_network_policy_is_created_once_before_the_coordinator_and_admits_the_operator():
    operator = OperatorPods("ftjob-system", {"app.kubernetes.io/name": "ftjob"})
    first = plan(Observed(job=job(), new_token="t", network_policy=True, operator_pods=operator), NOW)
    assert [a.kind for a in first.of(Create)] == ["Secret", "NetworkPolicy", "Service"]
    policy = next(a.manifest for a in first.of(Create) if a.kind == "NetworkPolicy")
    assert policy["metadata"]["name"] == "tj-coordinator" and policy["metadata"]["ownerReferences"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "ftjob.dev/job-name": "tj",
        "ftjob.dev/role": "coordinator",
    }
    job_pods, operator_pods = policy["spec"]["ingress"]
    assert job_pods["from"] == [{"podSelector": {"matchLabels": {"ftjob.dev/job-name": "tj"}}}]
    assert [p["port"] for p in job_pods["ports"]] == [contract.RDZV_PORT, contract.CONTROL_PORT]
    assert operator_pods["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ftjob-system"
    }
    assert [p["port"] for p in operator_pods["ports"]] == [contract.CONTROL_PORT]

    made = Observed(job=job(), secret_exists=True, network_policy=True, network_policy_exists=True)
    assert [a.kind for a in plan(made, NOW).of(Create)] == ["Service"]
    # An operator outside the cluster: only the job's own pods are admitted; no policy when turned off.
    outside = plan(Observed(job=job(), secret_exists=True, network_policy=True), NOW)
    assert (
        len(next(a.manifest for a in outside.of(Create) if a.kind == "NetworkPolicy")["spec"]["ingress"]) == 1
    )
    assert [a.kind for a in plan(Observed(job=job(), secret_exists=True), NOW).of(Create)] == ["Service"]


def test_service_without_cluster_ip_creates_no_workers():
    p = plan(Observed(job=job(), service=service(ip=None), secret_exists=True), NOW)
    assert pods_created(p) == []


def test_a_stale_pod_list_reissues_the_same_creates_instead_of_new_pods():
    store = Store(job())
    store.apply(plan(store.observe(), NOW))  # secret + service
    created = plan(store.observe(), NOW)
    store.apply(created, apply_actions=False)  # status written, pods not (yet) visible
    again = plan(store.observe(), NOW)
    assert pods_created(again) == pods_created(created)
    assert again.status["operator"]["nextPodIndex"] == created.status["operator"]["nextPodIndex"]


@pytest.mark.parametrize(
    "min_,max_,replicas,expected", [(1, 1, None, 1), (1, 3, None, 3), (1, 3, 2, 2), (2, 4, 4, 4)]
)
def test_elastic_worker_count(min_, max_, replicas, expected):
    workers = {"min": min_, "max": max_} | ({"replicas": replicas} if replicas else {})
    store = Store(job(workers=workers))
    converge(store, NOW)
    assert len(store.names("worker")) == expected
    args = store.pods[store.names("worker")[0]]["spec"]["containers"][0]["args"]
    assert f"--nnodes={min_}:{max_}" in args
    assert store.status["workers"] == {
        "desired": expected,
        "active": expected,
        "ready": expected,
        "spares": 0,
    }
    assert store.status["phase"] == "Running"
    assert condition(store.status, "Running")["status"] == "True"


def test_scale_down_retires_the_newest_worker_then_deletes_it_without_counting_a_loss():
    store = started()
    store.job["spec"]["workers"] = {"min": 1, "max": 2, "replicas": 1}
    p = plan(store.observe(), at(10))
    assert p.status["operator"]["retiredPods"] == ["tj-worker-2"] and not p.of(
        Delete
    )  # retire first, delete next pass
    assert "ScaledDown" in reasons(p)
    store.apply(p)
    p2 = plan(store.observe(), at(11))
    assert [a.name for a in p2.of(Delete)] == ["tj-worker-2"]
    store.apply(p2)
    store.finish_terminating()
    converge(store, at(12))
    assert store.names("worker") == ["tj-worker-1"]
    assert (store.status["preemptions"], store.status["failures"]) == (0, 0)


def test_scale_up_adds_a_worker_with_a_new_name():
    store = started(expect=1, workers={"min": 1, "max": 3, "replicas": 1})
    store.job["spec"]["workers"]["replicas"] = 3
    p = plan(store.observe(), at(5))
    assert pods_created(p) == ["tj-worker-2", "tj-worker-3"] and "ScaledUp" in reasons(p)


def test_a_pod_on_a_vanished_node_is_force_deleted_once_counted():
    store = started()
    victim = store.names("worker")[0]
    store.nodes = [n for n in store.nodes if n["metadata"]["name"] != "node-a"] + [node("node-c")]
    store.schedule_to = "node-c"
    for p in store.pods.values():
        if p["metadata"]["name"] != victim:
            p["spec"]["nodeName"] = "node-c"
    first = plan(store.observe(), NOW)
    assert first.status["preemptions"] == 1 and not first.of(Delete)  # counted first
    store.apply(first)
    second = plan(store.observe(), at(1))
    assert Delete("Pod", victim) in second.actions  # graceful first: it may still be saving
    store.apply(second)
    store.pods[victim]["metadata"]["deletionTimestamp"] = contract.format_time(at(20))  # its grace ends then
    assert not plan(store.observe(), at(19)).of(Delete)
    # No kubelet finishes the graceful delete on a vanished node: remove the object once the grace is over.
    assert Delete("Pod", victim, 0) in plan(store.observe(), at(20)).actions


# --- warm spares (spec.workers.spares) --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("workers", "pods", "counts"),
    [
        # spares run beyond max: the status counts them apart, active/ready stop at desired (the scale subresource)
        ({"min": 2, "max": 2, "spares": 1}, 3, {"desired": 2, "active": 2, "ready": 2, "spares": 1}),
        ({"min": 1, "max": 2, "spares": 2}, 4, {"desired": 2, "active": 2, "ready": 2, "spares": 2}),
        # below max a spare would join training (c10d admits up to max): none
        (
            {"min": 1, "max": 3, "replicas": 2, "spares": 1},
            2,
            {"desired": 2, "active": 2, "ready": 2, "spares": 0},
        ),
        ({"min": 2, "max": 2}, 2, {"desired": 2, "active": 2, "ready": 2, "spares": 0}),
    ],
)
def test_warm_spares_run_beyond_max_and_are_counted_apart(workers, pods, counts):
    store = Store(job(workers=workers))
    converge(store, NOW)
    assert len(store.names("worker")) == pods
    assert store.status["workers"] == counts
    args = store.pods[store.names("worker")[-1]]["spec"]["containers"][0]["args"]
    assert f"--nnodes={workers['min']}:{workers['max']}" in args  # a spare is a worker pod like the others


def test_a_preempted_worker_with_a_spare_is_replaced_by_a_new_spare_and_counted_once():
    store = started(expect=3, workers={"min": 2, "max": 2, "spares": 1})
    lost = store.names("worker")[0]
    store.preempt(lost)
    p = plan(store.observe(), NOW)
    store.apply(p)
    assert (p.status["preemptions"], p.status["failures"]) == (1, 0)
    # the spare took the lost worker's place in the rendezvous: the desired workers are there at once
    assert p.status["workers"] == {"desired": 2, "active": 2, "ready": 2, "spares": 0}
    assert pods_created(p) == ["tj-worker-4"] and "Replaced" in reasons(p)
    store.finish_terminating()
    converge(store, NOW)
    assert store.status["workers"] == {"desired": 2, "active": 2, "ready": 2, "spares": 1}
    assert store.status["preemptions"] == 1 and len(store.names("worker")) == 3


def test_fewer_spares_retire_the_newest_pods():
    store = started(expect=4, workers={"min": 2, "max": 2, "spares": 2})
    store.job["spec"]["workers"]["spares"] = 0
    p = converge(store, NOW)
    store.finish_terminating()
    converge(store, NOW)
    assert store.names("worker") == ["tj-worker-1", "tj-worker-2"], p
    assert store.status["workers"]["spares"] == 0
