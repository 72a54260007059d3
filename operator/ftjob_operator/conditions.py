"""Condition types, reasons and the one function that sets a condition (JobSet's setCondition habit).

Reasons are CamelCase constants used by both conditions and events, so `kubectl describe` and
`kubectl get tj -o yaml` speak the same words.
"""

from __future__ import annotations

from typing import Any

# --- condition types (api.ConditionType) -----------------------------------------------------------------------
CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
PREEMPTED = "Preempted"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
INVALID_SPEC = "InvalidSpec"
CHECKPOINT_FAILING = "CheckpointFailing"  # the newest save was dropped: a resume would lose the steps since

TRUE = "True"
FALSE = "False"

# --- reasons (conditions and events) ---------------------------------------------------------------------------
REASON_CREATED = "Created"  # the first pods were created
REASON_TRAINING = "Training"  # coordinator ready and at least min workers running
REASON_WAITING_FOR_WORKERS = "WaitingForWorkers"
REASON_WAITING_FOR_COORDINATOR = "WaitingForCoordinator"
REASON_PREEMPTED = "Preempted"  # a pod was lost to preemption, eviction or node loss
REASON_REPLACED = "Replaced"  # a lost worker got a replacement
REASON_RECOVERED = "Recovered"  # back to the desired workers after a preemption
REASON_COORDINATOR_REPLACED = "CoordinatorReplaced"
REASON_WORKER_FAILED = "WorkerFailed"  # a pod failed on its own: counts against the failure budget
REASON_COORDINATOR_FAILED = "CoordinatorFailed"
REASON_LOST_WITH_COORDINATOR = "LostWithCoordinator"  # a worker stopped soon after the coordinator went away
REASON_RESTART_BACKOFF = "RestartBackoff"  # waiting out the backoff before a failure restart
REASON_RESTARTED = "Restarted"  # a new restart generation of pods was created
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"  # failure budget spent
REASON_CONFIG_ERROR = "TrainerConfigError"  # the trainer exited 2: its configuration is wrong, no retry
REASON_PREEMPTION_LIMIT = "PreemptionLimitExceeded"
REASON_CHECKPOINT_REQUESTED = "CheckpointRequested"
REASON_TERMINATION_NOTICE = "TerminationNotice"
REASON_SUSPENDING = "Suspending"
REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
REASON_SUCCEEDED = "Succeeded"
REASON_INVALID_SPEC = "InvalidSpec"
CHECKPOINT_FAILING = "CheckpointFailing"  # the newest save was dropped: a resume would lose the steps since
REASON_SPEC_VALID = "SpecValid"
REASON_SCALED_UP = "ScaledUp"
REASON_SCALED_DOWN = "ScaledDown"
REASON_TTL_EXPIRED = "TTLExpired"
REASON_SPEC_CHANGED = "SpecChanged"  # the pods' template changed: restart them (they checkpoint on SIGTERM)
REASON_CHECKPOINT_SAVE_FAILED = "CheckpointSaveFailed"  # the trainer dropped a save (full disk, ...)
REASON_CHECKPOINT_SAVED = "CheckpointSaved"  # a checkpoint newer than the dropped save committed
REASON_FINISHED = "Finished"  # Running/Restarting turned off because the job ended

NORMAL = "Normal"
WARNING = "Warning"


def find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]], type_: str) -> bool:
    c = find(conditions, type_)
    return bool(c and c.get("status") == TRUE)


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """A new list with `type_` set. lastTransitionTime moves only when the status flips, not when reason/message change."""
    if status not in (TRUE, FALSE, "Unknown"):
        raise ValueError(f"condition status must be True, False or Unknown (got {status!r})")
    old = find(conditions, type_)
    transition = now if old is None or old.get("status") != status else old.get("lastTransitionTime", now)
    new = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if generation is not None:
        new["observedGeneration"] = generation
    out = [c for c in conditions if c.get("type") != type_]
    out.append(new)
    # Stable order (the API's order of types) keeps status diffs small and tests readable.
    order = [
        CREATED,
        RUNNING,
        RESTARTING,
        PREEMPTED,
        SUSPENDED,
        SUCCEEDED,
        FAILED,
        INVALID_SPEC,
        CHECKPOINT_FAILING,
    ]
    return sorted(out, key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))
