"""The status summary: progress, counts, the phase (decided in one place), the merge patch the handlers write."""

from __future__ import annotations

import pytest
from ftjob_operator import api, planner
from ftjob_operator import conditions as cond
from ftjob_operator.planner import plan, summary
from ftjob_operator.planner.context import Context, Ending
from tj_builders import NOW, healthy_status, job, running_observed, started


def test_progress_lands_in_status():
    obs = running_observed(
        job(), progress={"step": 17, "lastCheckpoint": {"step": 10, "time": "2026-01-01T11:59:00Z"}}
    )
    st = plan(obs, NOW).status
    assert st["step"] == 17 and st["lastCheckpoint"] == {"step": 10, "time": "2026-01-01T11:59:00Z"}


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


# --- status.phase, decided in one place (summary.decide_phase) --------------------------------------------------
def _ctx(phase: str | None = None, backoff: bool = False, true: tuple[str, ...] = ()) -> Context:
    st = dict(healthy_status(), phase=phase) if phase else healthy_status()
    if backoff:
        st["operator"]["backoffUntil"] = "2026-01-01T12:00:10Z"
    ctx = Context(running_observed(job(status=st)), NOW)
    for type_ in true:
        ctx.condition(type_, cond.TRUE, "Test")
    return ctx


@pytest.mark.parametrize(
    "ending,phase",
    [
        (Ending.INVALID, "Invalid"),
        (Ending.SUSPENDING, "Suspending"),
        (Ending.SUSPENDED, "Suspended"),
        (Ending.RESTARTING, "Restarting"),
        (Ending.SUCCEEDED, "Succeeded"),
        (Ending.FAILED, "Failed"),
    ],
)
def test_an_ending_that_names_a_phase_decides_it(ending, phase):
    for training in (False, True):
        assert summary.decide_phase(_ctx("Running"), ending, training) == phase


@pytest.mark.parametrize("ending", [Ending.DELETING, Ending.FINISHED])
@pytest.mark.parametrize("before", ["Succeeded", "Failed", "Running", None])
def test_deleting_and_finished_keep_the_phase(ending, before):
    assert summary.decide_phase(_ctx(before), ending, True) == before


@pytest.mark.parametrize(
    "ctx_args,training,phase",
    [
        ({}, True, "Running"),
        ({}, False, "Pending"),
        ({"phase": "Pending"}, False, "Pending"),
        ({"true": (cond.RESTARTING,)}, False, "Restarting"),
        ({"phase": "Running", "true": (cond.PREEMPTED,)}, False, "Running"),
        ({"phase": "Pending", "true": (cond.PREEMPTED,)}, False, "Pending"),
        ({"phase": "Restarting", "backoff": True}, True, "Restarting"),
        ({"phase": "Restarting"}, True, "Running"),
        ({"phase": "Running", "backoff": True}, False, "Pending"),
    ],
    ids=[
        "training",
        "not yet",
        "still not",
        "restart under way",
        "training on with fewer workers after a preemption",
        "a preemption before it ever ran",
        "a restart backing off",
        "a restart that runs again",
        "a backoff left over from a coordinator restart",
    ],
)
def test_from_pods_the_phase_follows_what_runs(ctx_args, training, phase):
    assert summary.decide_phase(_ctx(**ctx_args), Ending.FROM_PODS, training) == phase
