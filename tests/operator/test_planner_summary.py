"""The status summary: progress, counts, the phase (decided in one place), the merge patch the handlers write."""

from __future__ import annotations

import pytest
from ftjob_operator import api, planner
from ftjob_operator import conditions as cond
from ftjob_operator.planner import plan, summary
from ftjob_operator.planner.context import Context, Ending
from tj_builders import NOW, condition, healthy_status, job, reasons, running_observed, started


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


# --- a save the trainer dropped (summary.record_checkpoint_failure) ---------------------------------------------
FULL = (
    "checkpoint of step 6 (periodic) was not saved: rank 0: OSError: [Errno 28] No space left on device (full: give "
    "the checkpoint volume room for --keep-last + 1 checkpoints); the last committed one stays /ckpt/step-000000004"
)


def _failure(step: int = 6, time: str = "2026-01-01T11:59:30Z") -> dict:
    return {"step": step, "kind": "periodic", "message": FULL, "kept": "/ckpt/step-000000004", "time": time}


def _committed(step: int) -> dict:
    return {"step": step, "path": f"/ckpt/step-{step:09d}", "time": "2026-01-01T11:59:00Z"}


def test_a_dropped_save_sets_checkpoint_failing_once_and_a_later_commit_clears_it():
    store = started()
    store.progress = {"step": 7, "lastCheckpoint": _committed(4), "checkpointFailure": _failure()}
    first = planner.plan(store.observe(), NOW)
    store.apply(first)
    failing = condition(store.status, cond.CHECKPOINT_FAILING)
    assert (failing["status"], failing["reason"]) == ("True", "CheckpointSaveFailed")
    assert failing["message"] == FULL
    assert store.status["lastCheckpointFailure"] == _failure()
    assert reasons(first).count("CheckpointSaveFailed") == 1
    # the same report on the next pass (or after an operator restart): no second event, the condition stands
    again = planner.plan(store.observe(), NOW)
    store.apply(again)
    assert "CheckpointSaveFailed" not in reasons(again)
    assert condition(store.status, cond.CHECKPOINT_FAILING)["status"] == "True"
    # a checkpoint of the failed step's own step or before does not end it; a later one does
    store.progress["lastCheckpoint"] = _committed(6)
    store.apply(planner.plan(store.observe(), NOW))
    assert condition(store.status, cond.CHECKPOINT_FAILING)["status"] == "True"
    store.progress["lastCheckpoint"] = _committed(8)
    store.apply(planner.plan(store.observe(), NOW))
    cleared = condition(store.status, cond.CHECKPOINT_FAILING)
    assert (cleared["status"], cleared["reason"]) == ("False", "CheckpointSaved")
    assert cleared["message"] == "step 8 committed after the failed save of step 6"
    assert store.status["lastCheckpointFailure"]["step"] == 6  # the history stays
    # a coordinator recreated since knows no failure: nothing changes
    store.progress = {"step": 9, "lastCheckpoint": _committed(8)}
    store.apply(planner.plan(store.observe(), NOW))
    assert condition(store.status, cond.CHECKPOINT_FAILING)["status"] == "False"
    # a new failure is a new event and sets it again
    store.progress["checkpointFailure"] = _failure(10, "2026-01-01T11:59:50Z")
    p = planner.plan(store.observe(), NOW)
    store.apply(p)
    assert reasons(p).count("CheckpointSaveFailed") == 1
    assert condition(store.status, cond.CHECKPOINT_FAILING)["status"] == "True"


def test_no_checkpoint_failing_condition_while_saves_succeed():
    store = started()
    store.progress = {"step": 7, "lastCheckpoint": _committed(4)}
    store.apply(planner.plan(store.observe(), NOW))
    assert cond.find(store.status["conditions"], cond.CHECKPOINT_FAILING) is None
    assert "lastCheckpointFailure" not in store.status


def test_a_long_failure_message_is_cut_and_a_failure_before_any_commit_counts():
    store = started()
    store.progress = {"step": 3, "checkpointFailure": dict(_failure(2), message="x" * 5000, kept=None)}
    store.apply(planner.plan(store.observe(), NOW))
    failing = condition(store.status, cond.CHECKPOINT_FAILING)
    assert failing["status"] == "True" and len(failing["message"]) == 1024
    assert failing["message"].endswith("...") and "kept" not in store.status["lastCheckpointFailure"]
