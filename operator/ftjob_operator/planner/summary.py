"""The status summary: what the coordinator reported, the worker counts, the pod bookkeeping, the Running
condition and `status.phase`, written once at the end of every pass (`conclude`). `decide_phase` is the one place
the phase is decided. `status_patch` turns the new status into the merge patch the handlers write.
"""

from __future__ import annotations

from typing import Any

from ftjob_trainer import contract

from .. import api, render
from .. import conditions as cond
from . import preemption, progress
from .context import Context, Ending
from .observed import pod_name

# Endings whose pods are counted here; the others leave the counts alone (invalid, deleting) or count their own
# way (finished, suspended).
_COUNTED = (Ending.RESTARTING, Ending.SUCCEEDED, Ending.FAILED, Ending.FROM_PODS)


def record_progress(ctx: Context) -> None:
    """The coordinator's progress (step, newest committed checkpoint, newest world epoch) and the scale
    subresource's selector."""
    ctx.st.selector = render.worker_selector(ctx.ref.name)
    p = ctx.o.progress or {}
    if isinstance(p.get("step"), int):
        ctx.st.step = p["step"]
    epoch = p.get("worldEpoch")
    if isinstance(epoch, int) and not isinstance(epoch, bool):  # the fence's newest world (fence.py)
        ctx.st.operator.world_epoch = max(ctx.st.operator.world_epoch, epoch)
    ck = p.get("lastCheckpoint")
    if isinstance(ck, dict) and isinstance(ck.get("step"), int):
        old = ctx.st.last_checkpoint
        if old is None or ck["step"] >= old.step:
            ctx.st.last_checkpoint = api.CheckpointStatus(
                step=ck["step"], time=ck.get("time"), path=ck.get("path")
            )
    record_checkpoint_failure(ctx, p.get("checkpointFailure"))


def record_checkpoint_failure(ctx: Context, reported: Any) -> None:
    """A save the trainer dropped (it trains on): a Warning event once, status.lastCheckpointFailure, and condition
    CheckpointFailing until a checkpoint of a later step commits. Steps, not times: the trainer's commit times carry
    whole seconds, and a save can fail within the second its predecessor committed."""
    if isinstance(reported, dict) and isinstance(reported.get("step"), int):
        new = api.CheckpointFailureStatus(
            step=reported["step"],
            kind=_text(reported.get("kind")),
            message=_text(reported.get("message")) or "the trainer gave no message",
            kept=_text(reported.get("kept")),
            time=_text(reported.get("time")),
        )
        if new != ctx.st.last_checkpoint_failure:
            ctx.st.last_checkpoint_failure = new
            ctx.event(cond.WARNING, cond.REASON_CHECKPOINT_SAVE_FAILED, new.message)
    failed, saved = ctx.st.last_checkpoint_failure, ctx.st.last_checkpoint
    if failed is None:
        return
    if saved is None or saved.step <= failed.step:
        ctx.condition(cond.CHECKPOINT_FAILING, cond.TRUE, cond.REASON_CHECKPOINT_SAVE_FAILED, failed.message)
    elif cond.is_true(ctx.conds, cond.CHECKPOINT_FAILING):
        ctx.condition(
            cond.CHECKPOINT_FAILING,
            cond.FALSE,
            cond.REASON_CHECKPOINT_SAVED,
            f"step {saved.step} committed after the failed save of step {failed.step}",
        )


def _text(value: Any) -> str | None:
    """A string the trainer sent, cut to what a status field should hold (the start says which step and rank)."""
    if not isinstance(value, str):
        return None
    return (
        value if len(value) <= contract.ERROR_MESSAGE_MAX else value[: contract.ERROR_MESSAGE_MAX - 3] + "..."
    )


def conclude(ctx: Context, ending: Ending) -> None:
    """The end of every pass: the counts and bookkeeping the ending calls for, then the phase."""
    training = False
    if ending is Ending.FINISHED:
        _count_finished(ctx)
    elif ending in (Ending.SUSPENDING, Ending.SUSPENDED):
        _count_suspended(ctx, ending)
    elif ending in _COUNTED:
        training = _count_pods(ctx, ending)
    progress.account(ctx, ending)
    ctx.st.phase = decide_phase(ctx, ending, training)


def decide_phase(ctx: Context, ending: Ending, training: bool) -> str | None:
    """status.phase, a one-word summary: from how the pass ended and, when the pods decide, what runs."""
    if ending in (Ending.DELETING, Ending.FINISHED):
        return ctx.prev.phase
    if ending is not Ending.FROM_PODS:
        return ending.value
    if _restart_backing_off(ctx):
        return "Restarting"
    if training:
        return "Running"
    if cond.is_true(ctx.conds, cond.RESTARTING):
        return "Restarting"
    if ctx.prev.phase == "Running" and cond.is_true(ctx.conds, cond.PREEMPTED):
        return "Running"  # training goes on with fewer workers while the lost ones are replaced
    return "Pending"


def _restart_backing_off(ctx: Context) -> bool:
    """A restart waits out its backoff (or its old generation): its Restarting phase and conditions stand."""
    return ctx.prev.phase == "Restarting" and bool(ctx.st.operator.backoff_until)


def _count_finished(ctx: Context) -> None:
    ctx.st.workers = api.WorkersStatus(desired=ctx.st.workers.desired, active=0, ready=0)
    ctx.st.operator.known_pods, ctx.st.operator.pending_pods = [], []
    ctx.st.operator.noticed_pods = [n for n in ctx.st.operator.noticed_pods if n in ctx.by_name]
    ctx.st.operator.retired_pods = [n for n in ctx.st.operator.retired_pods if n in ctx.by_name]


def _count_suspended(ctx: Context, ending: Ending) -> None:
    workers = ctx.alive(render.ROLE_WORKER)
    ctx.st.workers = api.WorkersStatus(
        desired=0, active=len(workers), ready=sum(map(ctx.placed_ready, workers))
    )
    if ending is Ending.SUSPENDED:
        ctx.st.operator.known_pods = []


def _count_pods(ctx: Context, ending: Ending) -> bool:
    """Counts, bookkeeping and the Running condition; True when training runs (coordinator and min workers)."""
    if ctx.st.operator.restart_generation != ctx.prev.operator.restart_generation:
        # This pass retired the whole generation: nothing of it counts any more.
        ctx.st.workers = api.WorkersStatus(desired=ctx.st.workers.desired, active=0, ready=0)
        ctx.st.operator.known_pods = []
        return False
    retired = set(ctx.st.operator.retired_pods)
    workers = [p for p in ctx.alive(render.ROLE_WORKER) if pod_name(p) not in retired]
    coordinators = ctx.alive(render.ROLE_COORDINATOR)
    ready = sum(map(ctx.placed_ready, workers))
    desired = ctx.spec.workers.desired if ctx.spec else ctx.st.workers.desired
    # Pods beyond the desired count are warm spares (spec.workers.spares), whichever of them the rendezvous left out.
    spares = max(0, len(workers) - desired)
    ready = min(ready, desired)
    ctx.st.workers = api.WorkersStatus(
        desired=desired, active=len(workers) - spares, ready=ready, spares=spares
    )
    # Only pods still listed need remembering: a name never comes back.
    ctx.st.operator.retired_pods = [
        n for n in ctx.st.operator.retired_pods if n in ctx.by_name or n not in ctx.prev.operator.retired_pods
    ]
    ctx.st.operator.noticed_pods = [n for n in ctx.st.operator.noticed_pods if n in ctx.by_name]
    ctx.st.operator.known_pods = [pod_name(p) for p in workers + coordinators]
    if ending is not Ending.FROM_PODS or _restart_backing_off(ctx):
        return False
    coordinator_ready = any(map(ctx.placed_ready, coordinators))
    if coordinator_ready and ready >= ctx.spec.workers.min:
        ctx.condition(cond.RUNNING, cond.TRUE, cond.REASON_TRAINING, f"{ready}/{desired} workers running")
        if cond.is_true(ctx.conds, cond.RESTARTING):
            ctx.condition(cond.RESTARTING, cond.FALSE, cond.REASON_RESTARTED, "running again")
        preemption.mark_recovered(ctx, ready, desired)
        return True
    why = cond.REASON_WAITING_FOR_COORDINATOR if not coordinator_ready else cond.REASON_WAITING_FOR_WORKERS
    msg = f"{ready}/{desired} workers running (min {ctx.spec.workers.min})" + (
        "" if coordinator_ready else ", coordinator not ready"
    )
    if cond.find(ctx.conds, cond.RUNNING) is not None or ctx.st.start_time:
        ctx.condition(cond.RUNNING, cond.FALSE, why, msg)
    # No timer while waiting: whatever ends the wait (a pod's status, a node's readiness) is a watch event that
    # wakes the job. A poll here cost every waiting job a pass every few seconds, so thousands of queued jobs
    # slowed everyone's passes.
    return False


def status_patch(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch from `old` to `new` status: keys that disappeared become null (merge patch deletes them)."""
    patch: dict[str, Any] = {}
    old = old or {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            sub = status_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before:
            patch[key] = value
    return patch
