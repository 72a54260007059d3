"""The failure policy: the budget, the backoff, a whole-job restart as a new generation, and a crashed
coordinator recreated alone."""

from __future__ import annotations

import json

import pytest
from ftjob_operator import api, planner
from ftjob_operator import conditions as cond
from ftjob_operator.planner import Create, Delete, plan
from ftjob_trainer import contract
from tj_builders import NOW, UID, at, condition, converge, pod, pods_created, reasons, started


@pytest.mark.parametrize(
    "exit_code,reason,waiting",
    # exit code 2 (a configuration error) fails at once instead: test_planner_config_error.py
    [(1, "Error", None), (137, "OOMKilled", None), (3, "Error", None), (None, None, "ImagePullBackOff")],
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
    assert (st["failures"], st["restarts"], st["operator"]["restartGeneration"], st["preemptions"]) == (
        1,
        1,
        1,
        0,
    )
    assert st["phase"] == "Restarting" and not p.of(Create) and not p.of(Delete)  # deletes wait for the write
    assert st["lastFailure"]["pod"] == victim
    assert condition(st, "Restarting")["status"] == "True"
    until = contract.parse_time(st["operator"]["backoffUntil"])
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
    store.progress = {"step": 7, "worldEpoch": 1796334000123}  # the trainers' newest world (the fence)
    store.apply(plan(store.observe(), NOW))
    assert store.status["operator"]["worldEpoch"] == 1796334000123
    store.progress = None  # the coordinator is gone: nothing to read
    store.exit("tj-coordinator-0", 1, "Error")
    p = plan(store.observe(), NOW)
    assert (
        p.status["failures"] == 1
        and p.status["operator"]["restartGeneration"] == 0
        and p.status["phase"] == "Restarting"
    )
    assert not pods_created(p)  # a crash-looping coordinator must not burn the budget in seconds
    store.apply(p)
    converge(store, at(1))
    store.exit(store.names("worker")[0], 1, "Error")  # its store went away
    p2 = plan(store.observe(), at(5))
    assert (p2.status["failures"], p2.status["operator"]["restartGeneration"]) == (1, 0)
    assert "LostWithCoordinator" in reasons(p2) and not pods_created(p2)
    store.apply(p2)
    converge(store, at(10))  # backoff over (base 10 s)
    assert store.names("coordinator") == ["tj-coordinator-3"] and len(store.names("worker")) == 2
    assert "CoordinatorReplaced" in [e.reason for e in store.events]
    # the new coordinator refuses worlds older than the newest one its predecessor reported
    args = store.pods["tj-coordinator-3"]["spec"]["containers"][0]["args"]
    assert args[-1] == "--min-world-epoch=1796334000123", args
    assert store.status["phase"] == "Running" and condition(store.status, "Restarting")["status"] == "False"
    assert (store.status["failures"], store.status["restarts"]) == (1, 0)
