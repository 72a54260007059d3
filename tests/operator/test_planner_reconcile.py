"""plan() as a whole: pure and deterministic, refuses what it cannot read, and an operator restart in the
middle of each scenario creates no duplicates and loses no counter."""

from __future__ import annotations

import copy

import pytest
from ftjob_operator import planner
from ftjob_operator.planner import Delete, Observed, plan
from tj_builders import NOW, Store, at, healthy_status, job, running_observed


def test_same_observations_give_the_same_plan():
    obs = running_observed(job(status={"operator": {"knownPods": ["tj-worker-1"]}}), workers=1)
    assert plan(obs, NOW) == plan(copy.deepcopy(obs), NOW)


def test_plan_refuses_a_naive_time():
    with pytest.raises(ValueError, match="aware datetime"):
        plan(Observed(job=job()), NOW.replace(tzinfo=None))


def _counted_status() -> dict:
    return dict(healthy_status(), failures=2, restarts=1, preemptions=3)


def test_unknown_status_fields_from_a_newer_operator_keep_counters_and_pods():
    base = plan(running_observed(job(status=_counted_status())), NOW)
    p = plan(running_observed(job(status=dict(_counted_status(), newerField={"x": 1}))), NOW)
    assert p == base
    assert (p.status["failures"], p.status["restarts"], p.status["preemptions"]) == (2, 1, 3)
    assert p.status["operator"]["nextPodIndex"] == 3
    assert [a for a in p.actions if isinstance(a, Delete)] == []


def test_an_unreadable_status_plans_nothing_and_says_which_field():
    with pytest.raises(
        planner.InvalidStatus,
        match=r"status\.failures: .*nothing is changed|nothing is changed.*status\.failures",
    ):
        plan(running_observed(job(status=dict(_counted_status(), failures="many"))), NOW)


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


def counters(status: dict) -> dict:
    return {k: (status.get("operator", {}) if k == "restartGeneration" else status).get(k) for k in COUNTERS}


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
    expected = counters(reference.status)
    assert (*expected.values(), len(reference.names("worker"))) == EXPECTED[scenario]
    for crash_at in range(2, 9):
        store = _run(SCENARIOS[scenario], crash_at, crash_kind)
        got = counters(store.status)
        assert got == expected, f"crash at pass {crash_at}: {got} != {expected}"
        alive = [n for n, p in store.pods.items() if not p["metadata"].get("deletionTimestamp")]
        assert len(store.names("coordinator")) <= 1, alive
        assert len(store.names("worker")) == len(reference.names("worker")), (alive, sorted(reference.pods))
        # Pods made in all: a crash must not make a pod the uncrashed run did not (a 409 counts nothing).
        assert store.creates == reference.creates, f"crash at pass {crash_at}: {store.creates} pods created"
