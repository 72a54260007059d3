"""Table-driven tests of the pure planner: each policy, and an operator restart in the middle of each."""

from __future__ import annotations

import copy
import json

import pytest
from ftjob_operator import api, planner
from ftjob_operator import conditions as cond
from ftjob_operator.planner import Create, Delete, Event, Observed, RequestCheckpoint, plan
from ftjob_trainer import contract
from tj_builders import NOW, UID, Store, at, converge, job, node, pod, running_observed, service


def pods_created(p: planner.Plan) -> list[str]:
    return [a.name for a in p.of(Create) if a.kind == "Pod"]


def reasons(p: planner.Plan) -> list[str]:
    return [e.reason for e in p.of(Event)]


def condition(status: dict, type_: str) -> dict:
    c = cond.find(status.get("conditions", []), type_)
    assert c is not None, f"no {type_} condition in {status.get('conditions')}"
    return c


def started(expect: int = 2, **spec_overrides) -> Store:
    """A job whose coordinator and workers are running (planned from scratch, not hand-written)."""
    store = Store(job(**spec_overrides))
    converge(store, NOW)
    assert len(store.names("worker")) == expect, store.pods.keys()
    return store


# --- creation --------------------------------------------------------------------------------------------------
def test_first_pass_creates_secret_and_service_then_pods_once_the_service_has_an_ip():
    first = plan(Observed(job=job(), new_token="t0ken"), NOW)
    assert sorted(a.kind for a in first.of(Create)) == ["Secret", "Service"]
    assert first.requeue_after is not None

    obs = Observed(job=job(status=first.status), service=service(), secret_exists=True, new_token="x")
    second = plan(obs, NOW)
    assert pods_created(second) == ["tj-coordinator-0", "tj-worker-1", "tj-worker-2"]
    assert second.status["pendingPods"] == ["tj-coordinator-0", "tj-worker-1", "tj-worker-2"]
    assert condition(second.status, "Created")["status"] == "True"
    assert second.status["startTime"] == "2026-01-01T12:00:00Z"
    assert "Created" in reasons(second)


def test_service_without_cluster_ip_creates_no_workers():
    p = plan(Observed(job=job(), service=service(ip=None), secret_exists=True), NOW)
    assert pods_created(p) == []


def test_same_observations_give_the_same_plan():
    obs = running_observed(job(status={"knownPods": ["tj-worker-1"]}), workers=1)
    assert plan(obs, NOW) == plan(copy.deepcopy(obs), NOW)


def test_a_stale_pod_list_reissues_the_same_creates_instead_of_new_pods():
    store = Store(job())
    store.apply(plan(store.observe(), NOW))  # secret + service
    created = plan(store.observe(), NOW)
    store.apply(created, apply_actions=False)  # status written, pods not (yet) visible
    again = plan(store.observe(), NOW)
    assert pods_created(again) == pods_created(created)
    assert again.status["nextPodIndex"] == created.status["nextPodIndex"]


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
    assert store.status["workers"] == {"desired": expected, "active": expected, "ready": expected}
    assert store.status["phase"] == "Running"
    assert condition(store.status, "Running")["status"] == "True"


def test_scale_down_retires_the_newest_worker_then_deletes_it_without_counting_a_loss():
    store = started()
    store.job["spec"]["workers"] = {"min": 1, "max": 2, "replicas": 1}
    p = plan(store.observe(), at(10))
    assert p.status["retiredPods"] == ["tj-worker-2"] and not p.of(Delete)  # retire first, delete next pass
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


@pytest.mark.parametrize(
    "edit,restarts",
    [
        (lambda sp: sp["workers"].update(max=3), True),  # torchrun --nnodes changes
        (lambda sp: sp.update(image="ftjob-trainer:v2"), True),
        (lambda sp: sp.update(trainer={"steps": 500}), True),
        (lambda sp: sp["workers"].update(replicas=1), False),  # scale is live
        (lambda sp: sp.update(ttlSecondsAfterFinished=60), False),
        (lambda sp: sp["failurePolicy"].update(maxFailures=9), False),
    ],
)
def test_an_edited_pod_template_restarts_the_pods_without_counting_a_failure(edit, restarts):
    store = started()
    edit(store.job["spec"])
    store.job["metadata"]["generation"] = 2
    p = plan(store.observe(), NOW)
    assert (p.status["restartGeneration"] == 1) == restarts
    assert ("SpecChanged" in reasons(p)) == restarts
    if restarts:
        assert p.status["phase"] == "Restarting" and condition(p.status, "Restarting")["status"] == "True"
        assert condition(p.status, "Running")["status"] == "False" and p.status["workers"]["active"] == 0
        store.apply(p)
        converge(store, at(1))
        store.finish_terminating()
        converge(store, at(2))
        assert {planner.pod_generation(x) for x in store.pods.values()} == {1}
        assert (store.status["failures"], store.status["preemptions"], store.status["phase"]) == (
            0,
            0,
            "Running",
        )
        assert condition(store.status, "Restarting")["status"] == "False"


@pytest.mark.parametrize("owner", ["someone-else", None], ids=["owned by another object", "no owner"])
def test_pods_not_owned_by_the_job_are_left_alone(owner):
    stranger = pod("worker", 7, generation=5, owner_uid=owner)
    obs = running_observed(job(status={"knownPods": [], "nextPodIndex": 3, "startTime": "x"}))
    with_stranger = plan(Observed(**dict(obs.__dict__, pods=obs.pods + [stranger])), NOW)
    assert with_stranger == plan(obs, NOW)  # not deleted as an old generation, not counted, not a name source


# --- preemption ------------------------------------------------------------------------------------------------
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
        "trainer says preempted",
    ],
)
def test_preempted_worker_is_counted_once_and_replaced_at_once(variant):
    pods, nodes = _preempted_worker(variant)
    status = {
        "knownPods": ["tj-coordinator-0", "tj-worker-1", "tj-worker-2"],
        "nextPodIndex": 3,
        "startTime": "x",
    }
    obs = running_observed(job(status=status), pods=pods, nodes=nodes)
    p = plan(obs, NOW)
    assert (p.status["preemptions"], p.status["failures"], p.status["restartGeneration"]) == (1, 0, 0)
    assert pods_created(p) == ["tj-worker-3"], "the replacement must not wait for the old pod to terminate"
    assert "Preempted" in reasons(p) and "Replaced" in reasons(p)
    assert condition(p.status, "Preempted")["status"] == "True"
    # Operator restart: the same observations with the persisted status count nothing twice and create nothing new.
    created = dict(obs.__dict__, job=job(status=p.status))
    again = plan(Observed(**created), at(1))
    assert again.status["preemptions"] == 1
    assert pods_created(again) == ["tj-worker-3"]  # the same name re-issued (409), not a new pod


def _healthy_status() -> dict:
    return {
        "knownPods": ["tj-coordinator-0", "tj-worker-1", "tj-worker-2"],
        "nextPodIndex": 3,
        "startTime": "x",
    }


@pytest.mark.parametrize("nodes", [None, []], ids=["not listed", "empty index"])
def test_no_node_view_concludes_no_node_gone(nodes):
    obs = running_observed(job(status=_healthy_status()), nodes=nodes)
    p = plan(obs, NOW)
    assert (p.status["preemptions"], p.status["failures"], p.status["retiredPods"]) == (0, 0, [])
    assert [a for a in p.actions if isinstance(a, (Create, Delete))] == []


def test_a_node_missing_from_the_index_is_gone_only_after_its_deletion_was_seen():
    from ftjob_operator.handlers import node_view

    pods = [pod("coordinator", 0), pod("worker", 1), pod("worker", 2, node="node-new")]
    indexed = [node("node-a")]  # node-new's watch event has not arrived yet
    lagging = plan(
        running_observed(job(status=_healthy_status()), pods=pods, nodes=node_view(indexed, pods, set())), NOW
    )
    assert (lagging.status["preemptions"], lagging.status["retiredPods"]) == (0, [])
    assert [a for a in lagging.actions if isinstance(a, (Create, Delete))] == []
    assert node_view([], pods, set()) is None

    gone = plan(
        running_observed(
            job(status=_healthy_status()), pods=pods, nodes=node_view(indexed, pods, {"node-new"})
        ),
        NOW,
    )
    assert (gone.status["preemptions"], gone.status["retiredPods"]) == (1, ["tj-worker-2"])
    assert pods_created(gone) == ["tj-worker-3"]


def _counted_status() -> dict:
    return dict(_healthy_status(), failures=2, restarts=1, preemptions=3)


def test_unknown_status_fields_from_a_newer_operator_keep_counters_and_pods():
    base = plan(running_observed(job(status=_counted_status())), NOW)
    p = plan(running_observed(job(status=dict(_counted_status(), newerField={"x": 1}))), NOW)
    assert p == base
    assert (p.status["failures"], p.status["restarts"], p.status["preemptions"]) == (2, 1, 3)
    assert p.status["nextPodIndex"] == 3
    assert [a for a in p.actions if isinstance(a, Delete)] == []


def test_an_unreadable_status_plans_nothing_and_says_which_field():
    with pytest.raises(
        planner.InvalidStatus,
        match=r"status\.failures: .*nothing is changed|nothing is changed.*status\.failures",
    ):
        plan(running_observed(job(status=dict(_counted_status(), failures="many"))), NOW)


def test_a_known_pod_that_vanished_counts_as_a_preemption():
    status = {
        "knownPods": ["tj-coordinator-0", "tj-worker-1", "tj-worker-2"],
        "nextPodIndex": 3,
        "startTime": "x",
    }
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


# --- failures --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "exit_code,reason,waiting",
    [(1, "Error", None), (137, "OOMKilled", None), (2, "Error", None), (None, None, "ImagePullBackOff")],
)
def test_failure_restarts_the_job_after_backoff_with_a_new_generation(exit_code, reason, waiting):
    store = started()
    victim = store.names("worker")[1]
    if waiting:
        store.pods[victim] = pod("worker", int(victim.rsplit("-", 1)[1]), waiting=waiting)
    else:
        store.exit(victim, exit_code, reason, json.dumps({"reason": "error", "message": "boom"}))
    p = plan(store.observe(), NOW)
    st = p.status
    assert (st["failures"], st["restarts"], st["restartGeneration"], st["preemptions"]) == (1, 1, 1, 0)
    assert st["phase"] == "Restarting" and not p.of(Create) and not p.of(Delete)  # deletes wait for the write
    assert st["lastFailure"]["pod"] == victim
    assert condition(st, "Restarting")["status"] == "True"
    until = contract.parse_time(st["backoffUntil"])
    assert 8 <= (until - NOW).total_seconds() <= 10  # base 10 s, jitter 0.2
    store.apply(p)
    p2 = plan(store.observe(), at(1))
    assert sorted(a.name for a in p2.of(Delete)) == sorted(store.pods)  # the old generation goes
    store.apply(p2)
    assert not pods_created(plan(store.observe(), at(2)))  # still backing off
    store.finish_terminating()
    converge(store, at(11))
    assert store.status["phase"] == "Running"
    assert {planner.pod_generation(p) for p in store.pods.values()} == {1}
    assert store.status["failures"] == 1 and "Restarted" in [e.reason for e in store.events]


def test_failure_budget_spent_fails_with_pod_exit_code_and_message():
    store = started(failurePolicy={"maxFailures": 1})
    store.exit(
        store.names("worker")[0], 1, "Error", json.dumps({"reason": "error", "message": "CUDA error: boom"})
    )
    converge(store, NOW)
    store.finish_terminating()
    converge(store, at(60))
    victim = store.names("worker")[0]
    store.exit(victim, 3, "Error", json.dumps({"reason": "error", "message": "loss is NaN"}))
    converge(store, at(120))
    failed = condition(store.status, "Failed")
    assert store.status["phase"] == "Failed" and failed["reason"] == cond.REASON_BACKOFF_LIMIT
    assert (
        victim in failed["message"]
        and "exit code 3" in failed["message"]
        and "loss is NaN" in failed["message"]
    )
    assert store.status["completionTime"] == "2026-01-01T12:02:00Z"
    assert not [n for n, p in store.pods.items() if not p["metadata"].get("deletionTimestamp")]


def test_peers_failing_in_the_same_pass_count_as_one_failure():
    store = started()
    for name in store.names("worker"):
        store.exit(name, 1)
    p = plan(store.observe(), NOW)
    assert p.status["failures"] == 1 and p.status["restarts"] == 1


@pytest.mark.parametrize(
    "failures,low,high", [(1, 8, 10), (2, 16, 20), (3, 32, 40), (4, 48, 60), (9, 48, 60)]
)
def test_backoff_doubles_is_capped_and_jitter_is_deterministic(failures, low, high):
    policy = api.FailurePolicySpec(backoff_base_seconds=10, backoff_max_seconds=60, jitter=0.2)
    delay = planner.backoff_seconds(policy, UID, failures)
    assert low <= delay <= high
    assert delay == planner.backoff_seconds(policy, UID, failures)
    assert delay != planner.backoff_seconds(policy, "another-uid", failures)


def test_a_crashed_coordinator_is_recreated_after_backoff_and_its_collateral_workers_are_not_blamed():
    store = started()
    store.exit("tj-coordinator-0", 1, "Error")
    p = plan(store.observe(), NOW)
    assert (
        p.status["failures"] == 1 and p.status["restartGeneration"] == 0 and p.status["phase"] == "Restarting"
    )
    assert not pods_created(p)  # a crash-looping coordinator must not burn the budget in seconds
    store.apply(p)
    converge(store, at(1))
    store.exit(store.names("worker")[0], 1, "Error")  # its store went away
    p2 = plan(store.observe(), at(5))
    assert (p2.status["failures"], p2.status["restartGeneration"]) == (1, 0)
    assert "LostWithCoordinator" in reasons(p2) and not pods_created(p2)
    store.apply(p2)
    converge(store, at(10))  # backoff over (base 10 s)
    assert store.names("coordinator") == ["tj-coordinator-3"] and len(store.names("worker")) == 2
    assert "CoordinatorReplaced" in [e.reason for e in store.events]
    assert store.status["phase"] == "Running" and condition(store.status, "Restarting")["status"] == "False"
    assert (store.status["failures"], store.status["restarts"]) == (1, 0)


@pytest.mark.parametrize("coordinator_index", [0, 3], ids=["first coordinator", "replaced coordinator"])
def test_a_coordinator_and_a_worker_failing_in_one_pass_blame_the_coordinator(coordinator_index):
    workers = [i for i in range(4) if i != coordinator_index][:2]
    pods = [pod("coordinator", coordinator_index, exit_code=1)]
    pods += [pod("worker", workers[0], exit_code=1), pod("worker", workers[1])]
    status = {"knownPods": sorted(planner.pod_name(p) for p in pods), "nextPodIndex": 4, "startTime": "x"}
    p = plan(running_observed(job(status=status), pods=pods), NOW)
    assert (p.status["failures"], p.status["restartGeneration"], p.status["restarts"]) == (1, 0, 0)
    assert p.status["lastFailure"]["pod"] == f"tj-coordinator-{coordinator_index}"
    assert "LostWithCoordinator" in reasons(p)


def test_a_preempted_coordinator_counts_as_a_preemption():
    store = started()
    store.preempt("tj-coordinator-0")
    p = plan(store.observe(), NOW)
    assert (p.status["preemptions"], p.status["failures"]) == (1, 0)
    assert "tj-coordinator-3" in pods_created(p)


# --- success, TTL ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy,left", [("All", []), ("None", ["tj-worker-1"])])
def test_success_when_a_worker_exits_zero_and_cleanup_per_policy(policy, left):
    store = started(cleanPodPolicy=policy)
    store.exit("tj-worker-1", 0)  # tj-worker-2's torchrun may sit in its exit barrier for minutes
    p = plan(store.observe(), NOW)
    assert (
        p.status["phase"] == "Succeeded" and not p.of(Create) and not p.of(Delete)
    )  # deletes after the write
    assert condition(p.status, "Succeeded")["status"] == "True"
    assert condition(p.status, "Running")["status"] == "False"
    assert p.status["completionTime"] == "2026-01-01T12:00:00Z"
    store.apply(p)
    converge(store, at(1))
    store.finish_terminating()
    assert (
        sorted(store.pods) == left
    )  # still-running pods and the coordinator always go; ended ones per policy


def test_ttl_deletes_the_job_after_it_finished():
    store = started(ttlSecondsAfterFinished=30)
    for name in store.names("worker"):
        store.exit(name, 0)
    converge(store, NOW)
    early = plan(store.observe(), at(10))
    assert not [a for a in early.of(Delete) if a.kind == "TrainingJob"] and early.requeue_after == 20
    late = plan(store.observe(), at(30))
    assert Delete("TrainingJob", "tj", uid=UID) in late.actions  # never a recreated job of the same name


# --- suspend ---------------------------------------------------------------------------------------------------
def test_suspend_checkpoints_waits_then_deletes_pods_and_resume_continues():
    store = started()
    store.job["spec"]["suspend"] = True
    p = plan(store.observe(), NOW)
    assert [a.reason for a in p.of(RequestCheckpoint)] == ["suspend"] and p.status["phase"] == "Suspending"
    store.apply(p)
    assert not plan(store.observe(), at(5)).of(RequestCheckpoint)  # asked once, waiting
    store.progress = {
        "step": 40,
        "lastCheckpoint": {"step": 40, "time": "2026-01-01T12:00:06Z", "path": "/ck/40"},
    }
    p2 = plan(store.observe(), at(7))
    assert p2.status["phase"] == "Suspended" and p2.status["restartGeneration"] == 1
    assert "checkpoint at step 40" in condition(p2.status, "Suspended")["message"]
    store.apply(p2)
    converge(store, at(8))
    store.finish_terminating()
    converge(store, at(9))
    assert store.pods == {} and store.status["phase"] == "Suspended"
    assert (store.status["preemptions"], store.status["failures"]) == (0, 0)
    store.job["spec"]["suspend"] = False
    converge(store, at(20))
    assert store.status["phase"] == "Running" and len(store.names("worker")) == 2
    assert condition(store.status, "Suspended")["reason"] == cond.REASON_RESUMED
    assert store.status["lastCheckpoint"]["step"] == 40


def test_suspend_gives_up_waiting_after_the_timeout():
    store = started(checkpoint={"suspendTimeoutSeconds": 30})
    store.job["spec"]["suspend"] = True
    store.apply(plan(store.observe(), NOW))
    assert plan(store.observe(), at(29)).status["phase"] == "Suspending"
    p = plan(store.observe(), at(30))
    assert p.status["phase"] == "Suspended"
    assert "no checkpoint within suspendTimeoutSeconds" in condition(p.status, "Suspended")["message"]


def test_created_suspended_runs_nothing():
    p = plan(Observed(job=job(suspend=True), service=service(), secret_exists=True), NOW)
    assert p.status["phase"] == "Suspended" and not p.of(Create)


# --- invalid specs ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,overrides,fix",
    [
        ("tj", {"workers": {"min": 3, "max": 2}}, "spec.workers.min (3) must be <= spec.workers.max (2)"),
        (
            "tj",
            {"workers": {"min": 1, "max": 2, "replicas": 5}},
            "replicas (5) must be within min..max (1..2)",
        ),
        (
            "tj",
            {"podTemplate": {"env": [{"name": "FTJOB_TOKEN", "value": "x"}]}},
            "FTJOB_TOKEN is set by the operator",
        ),
        (
            "tj",
            {"podTemplate": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}},
            "mounts volume 'data', which no volume defines",
        ),
        (
            "tj",
            {"podTemplate": {"volumes": [{"name": "ftjob-checkpoints", "emptyDir": {}}]}},
            "ftjob-checkpoints is taken",
        ),
        ("tj", {"trainer": {"flags": {"checkpoint-dir": "/x"}}}, "set it there"),
        ("tj", {"checkpoint": {"volume": {}}}, "exactly one of persistentVolumeClaim, hostPath, emptyDir"),
        ("tj", {"command": []}, "spec.command is empty"),
        ("9lives", {}, "must be a DNS-1035 label"),
        (
            "tj",
            {"workers": {"min": 0, "max": 1}},
            "spec.workers.min: Input should be greater than or equal to 1",
        ),
    ],
)
def test_invalid_spec_says_what_to_fix_and_creates_nothing(name, overrides, fix):
    obs = Observed(job=job(name, **overrides), service=service(), secret_exists=True, new_token="t")
    p = plan(obs, NOW)
    assert not p.of(Create)
    invalid = condition(p.status, "InvalidSpec")
    assert invalid["status"] == "True" and fix in invalid["message"], invalid["message"]
    assert p.status["phase"] == "Invalid" and "InvalidSpec" in reasons(p)
    again = plan(Observed(**dict(obs.__dict__, job=job(name, status=p.status, **overrides))), at(1))
    assert "InvalidSpec" not in reasons(again)  # one event, not one per pass


def test_fixing_an_invalid_spec_clears_the_condition_and_starts():
    bad = plan(Observed(job=job(workers={"min": 3, "max": 2}), service=service(), secret_exists=True), NOW)
    good = plan(Observed(job=job(status=bad.status), service=service(), secret_exists=True), at(1))
    assert condition(good.status, "InvalidSpec")["status"] == "False" and pods_created(good)


# --- checkpoint request annotation -----------------------------------------------------------------------------
def test_checkpoint_request_annotation_is_asked_once_per_value():
    store = started()
    store.job["metadata"]["annotations"] = {"ftjob.dev/checkpoint-request": "1"}
    p = plan(store.observe(), NOW)
    assert [a.reason for a in p.of(RequestCheckpoint)] == ["annotation ftjob.dev/checkpoint-request=1"]
    store.apply(p)
    assert not plan(store.observe(), at(1)).of(RequestCheckpoint)
    store.job["metadata"]["annotations"]["ftjob.dev/checkpoint-request"] = "2"
    assert len(plan(store.observe(), at(2)).of(RequestCheckpoint)) == 1


def test_checkpoint_request_waits_for_a_ready_coordinator():
    obs = running_observed(
        job(annotations={"ftjob.dev/checkpoint-request": "now"}),
        pods=[pod("coordinator", 0, ready=False), pod("worker", 1)],
    )
    p = plan(obs, NOW)
    assert not p.of(RequestCheckpoint) and "handledCheckpointRequest" not in p.status


def test_progress_lands_in_status():
    obs = running_observed(
        job(), progress={"step": 17, "lastCheckpoint": {"step": 10, "time": "2026-01-01T11:59:00Z"}}
    )
    st = plan(obs, NOW).status
    assert st["step"] == 17 and st["lastCheckpoint"] == {"step": 10, "time": "2026-01-01T11:59:00Z"}


# --- operator restart in the middle of each scenario -----------------------------------------------------------
def _scenario_preemption(store: Store, t) -> None:
    store.preempt(store.names("worker")[0])


def _scenario_failure(store: Store, t) -> None:
    store.exit(store.names("worker")[0], 1)


def _scenario_scale(store: Store, t) -> None:
    store.job["spec"]["workers"]["replicas"] = 1


def _scenario_suspend(store: Store, t) -> None:
    store.job["spec"]["suspend"] = True


def _scenario_success(store: Store, t) -> None:
    for name in store.names("worker"):
        store.exit(name, 0)


def _scenario_coordinator(store: Store, t) -> None:
    store.preempt(store.names("coordinator")[0])


def _scenario_coordinator_crash(store: Store, t) -> None:
    store.exit(store.names("coordinator")[0], 1)


SCENARIOS = {
    "preemption": _scenario_preemption,
    "failure": _scenario_failure,
    "scale down": _scenario_scale,
    "suspend": _scenario_suspend,
    "success": _scenario_success,
    "coordinator preempted": _scenario_coordinator,
    "coordinator crashed": _scenario_coordinator_crash,
}
COUNTERS = ("preemptions", "failures", "restarts", "restartGeneration", "phase")
# What each scenario ends in without a crash: (preemptions, failures, restarts, restartGeneration, phase, workers).
EXPECTED = {
    "preemption": (1, 0, 0, 0, "Running", 2),
    "failure": (0, 1, 1, 1, "Running", 2),
    "scale down": (0, 0, 0, 0, "Running", 1),
    "suspend": (0, 0, 0, 1, "Suspended", 0),
    "success": (0, 0, 0, 0, "Succeeded", 0),
    "coordinator preempted": (1, 0, 0, 0, "Running", 2),
    "coordinator crashed": (0, 1, 0, 0, "Running", 2),
}


def _run(scenario, crash_at: int | None, crash_kind: str) -> Store:
    """Create, run the scenario, and converge; at pass `crash_at` the operator dies half-way through applying."""
    store = Store(job())
    passes = 0

    def step(now) -> None:
        nonlocal passes
        p = plan(store.observe(), now)
        if passes == crash_at:
            # status written but no action applied, or actions applied but the status write lost
            store.apply(
                p, write_status=crash_kind == "after-status", apply_actions=crash_kind == "after-actions"
            )
        else:
            store.apply(p)
        passes += 1

    for i in range(4):
        step(at(i))
    scenario(store, at(5))
    for i in range(40):
        step(at(6 + i * 5))
        if i % 3 == 2:
            store.finish_terminating()
    return store


@pytest.mark.parametrize("crash_kind", ["after-status", "after-actions"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_operator_restart_mid_scenario_creates_no_duplicates_and_loses_no_counter(scenario, crash_kind):
    reference = _run(SCENARIOS[scenario], None, crash_kind)
    expected = {k: reference.status.get(k) for k in COUNTERS}
    assert (*expected.values(), len(reference.names("worker"))) == EXPECTED[scenario]
    for crash_at in range(2, 9):
        store = _run(SCENARIOS[scenario], crash_at, crash_kind)
        got = {k: store.status.get(k) for k in COUNTERS}
        assert got == expected, f"crash at pass {crash_at}: {got} != {expected}"
        alive = [n for n, p in store.pods.items() if not p["metadata"].get("deletionTimestamp")]
        assert len(store.names("coordinator")) <= 1, alive
        assert len(store.names("worker")) == len(reference.names("worker")), (alive, sorted(reference.pods))
        # Pods made in all: a crash must not make a pod the uncrashed run did not (a 409 counts nothing).
        assert store.creates == reference.creates, f"crash at pass {crash_at}: {store.creates} pods created"


# --- conditions and status patches -----------------------------------------------------------------------------
def test_set_condition_keeps_transition_time_when_only_reason_changes():
    c1 = cond.set_condition([], "Running", "True", "Training", "1/2", now="T1", generation=1)
    c2 = cond.set_condition(c1, "Running", "True", "Training", "2/2", now="T2", generation=2)
    assert (
        c2[0]["lastTransitionTime"] == "T1" and c2[0]["message"] == "2/2" and c2[0]["observedGeneration"] == 2
    )
    c3 = cond.set_condition(c2, "Running", "False", "WaitingForWorkers", "", now="T3", generation=2)
    assert c3[0]["lastTransitionTime"] == "T3"
    with pytest.raises(ValueError, match="True, False or Unknown"):
        cond.set_condition(c3, "Running", "yes", "R", "", now="T4", generation=None)


def test_status_patch_nulls_removed_keys():
    old = {"phase": "Restarting", "backoffUntil": "T", "workers": {"desired": 2, "active": 0}}
    new = {"phase": "Running", "workers": {"desired": 2, "active": 2}}
    assert planner.status_patch(old, new) == {
        "phase": "Running",
        "backoffUntil": None,
        "workers": {"active": 2},
    }


def test_status_round_trips_through_the_model():
    store = started()
    assert api.parse_status(store.status).to_json() == store.status


def test_plan_refuses_a_naive_time():
    with pytest.raises(ValueError, match="aware datetime"):
        plan(Observed(job=job()), NOW.replace(tzinfo=None))


# --- the operator's default trainer image ----------------------------------------------------------------------
class DefaultImageStore(Store):
    """The store, observed by an operator whose default trainer image is `default_image`."""

    default_image = ""

    def observe(self) -> Observed:
        return Observed(**dict(super().observe().__dict__, default_image=self.default_image))


def _images(store: Store) -> set[str]:
    return {p["spec"]["containers"][0]["image"] for p in store.pods.values()}


def _without_image(**overrides) -> dict:
    j = job(**overrides)
    del j["spec"]["image"]
    return j


def test_unset_image_uses_the_operators_default_and_keeps_it():
    store = DefaultImageStore(_without_image())
    store.default_image = "ghcr.io/ftjob/trainer:0.1.0"
    converge(store, NOW)
    assert len(store.names("worker")) == 2 and _images(store) == {"ghcr.io/ftjob/trainer:0.1.0"}
    assert store.status["image"] == "ghcr.io/ftjob/trainer:0.1.0"
    # An operator upgraded to a new default does not restart a running job, nor lose the image it runs.
    store.default_image = "ghcr.io/ftjob/trainer:0.2.0"
    p = converge(store, at(5))
    assert not p.of(Delete) and store.status["restartGeneration"] == 0
    assert (
        _images(store) == {"ghcr.io/ftjob/trainer:0.1.0"}
        and store.status["image"] == "ghcr.io/ftjob/trainer:0.1.0"
    )
    # An image set in the spec wins (and restarts the pods, like any template edit).
    store.job["spec"]["image"] = "mine:1"
    store.job["metadata"]["generation"] = 2
    converge(store, at(10))
    store.finish_terminating()
    converge(store, at(11))
    assert store.status["restartGeneration"] == 1 and _images(store) == {"mine:1"}
    assert store.status["image"] == "mine:1"


def test_a_new_job_without_image_takes_the_current_default():
    store = DefaultImageStore(_without_image())
    store.default_image = "ghcr.io/ftjob/trainer:0.2.0"
    converge(store, NOW)
    assert _images(store) == {"ghcr.io/ftjob/trainer:0.2.0"}


def test_spec_image_wins_over_the_default():
    store = DefaultImageStore(job(image="mine:2"))
    store.default_image = "ghcr.io/ftjob/trainer:0.1.0"
    converge(store, NOW)
    assert _images(store) == {"mine:2"} and store.status["image"] == "mine:2"


def test_unset_image_without_a_default_is_invalid_until_the_operator_has_one():
    obs = Observed(job=_without_image(), service=service(), secret_exists=True, new_token="t")
    p = plan(obs, NOW)
    assert not p.of(Create) and p.status["phase"] == "Invalid"
    message = condition(p.status, "InvalidSpec")["message"]
    assert "spec.image is not set" in message and "FTJOB_DEFAULT_TRAINER_IMAGE" in message
    assert "image" not in p.status
    # The same job, observed by an operator that has a default: valid, and pods are created with it.
    fixed = Observed(**dict(obs.__dict__, job=_without_image(status=p.status), default_image="trainer:1"))
    good = plan(fixed, at(1))
    assert condition(good.status, "InvalidSpec")["status"] == "False"
    created = [a.manifest for a in good.of(Create) if a.kind == "Pod"]
    assert created and {m["spec"]["containers"][0]["image"] for m in created} == {"trainer:1"}


# --- rendezvous ids across replacements and restarts -------------------------------------------------------------
def _rdzv_ids(store: Store) -> dict[str, str]:
    ids = {}
    for name in store.names("worker"):
        args = store.pods[name]["spec"]["containers"][0]["args"]
        ids[name] = next(a for a in args if a.startswith("--rdzv-id="))
    return ids


def test_replacements_keep_the_rendezvous_id_and_a_restart_generation_gets_a_new_one():
    store = started()
    before = _rdzv_ids(store)
    assert set(before.values()) == {f"--rdzv-id={UID}-g0"}
    # A preempted worker's replacement joins the same rendezvous as the survivor.
    store.preempt(store.names("worker")[0])
    converge(store, at(1))
    after = _rdzv_ids(store)
    assert len(after) == 2 and set(after) != set(before) and set(after.values()) == {f"--rdzv-id={UID}-g0"}
    # A failure restarts the job: the new generation's workers use a new rendezvous id.
    store.exit(store.names("worker")[0], 1, "Error")
    converge(store, at(2))
    store.finish_terminating()
    converge(store, at(60))
    assert store.status["restartGeneration"] == 1
    assert set(_rdzv_ids(store).values()) == {f"--rdzv-id={UID}-g1"}
