"""`status`: what the operator observed, written only by it. Counters live here: an operator restart loses none."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import StatusModel

ConditionType = Literal[
    "Created", "Running", "Restarting", "Preempted", "Suspended", "Succeeded", "Failed", "InvalidSpec"
]
CONDITION_TYPES: tuple[str, ...] = ConditionType.__args__  # type: ignore[attr-defined]
Phase = Literal[
    "Pending", "Running", "Restarting", "Suspending", "Suspended", "Succeeded", "Failed", "Invalid"
]
PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]
FINISHED_PHASES = ("Succeeded", "Failed")


class Condition(StatusModel):
    """A metav1.Condition."""

    type: ConditionType = Field(..., description="type of the condition.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="status is True, False or Unknown.")
    reason: str = Field(..., min_length=1, description="reason is a CamelCase word for the last transition.")
    message: str = Field("", description="message says what happened, for humans.")
    last_transition_time: str = Field(
        ...,
        description="lastTransitionTime is when status last changed.",
        json_schema_extra={"format": "date-time"},
    )
    observed_generation: int | None = Field(
        None, description="observedGeneration is the spec generation it describes."
    )


class WorkersStatus(StatusModel):
    """Worker counts."""

    desired: int = Field(0, description="desired is the worker count the operator keeps (replicas or max).")
    active: int = Field(0, description="active is worker pods that exist and are not lost.")
    ready: int = Field(0, description="ready is active workers that are running.")


class CheckpointStatus(StatusModel):
    """The newest committed checkpoint the coordinator reported."""

    step: int = Field(..., description="step of the checkpoint.")
    time: str | None = Field(
        None, description="time the checkpoint was committed.", json_schema_extra={"format": "date-time"}
    )
    path: str | None = Field(None, description="path of the checkpoint directory inside the pods.")


class FailureStatus(StatusModel):
    """What the last failure was (the Failed condition's message repeats it)."""

    pod: str = Field(..., description="pod that failed.")
    exit_code: int | None = Field(None, description="exitCode of its container.")
    reason: str | None = Field(None, description="reason Kubernetes or the trainer gave.")
    message: str | None = Field(None, description="message is the trainer's termination message.")
    time: str | None = Field(
        None, description="time the failure was counted.", json_schema_extra={"format": "date-time"}
    )


def names_set(description: str) -> Any:
    return Field(
        default_factory=list, description=description, json_schema_extra={"x-kubernetes-list-type": "set"}
    )


class TrainingJobStatus(StatusModel):
    """The observed state, written only by the operator. Counters live here so an operator restart loses nothing."""

    phase: Phase | None = Field(None, description="phase is a one-word summary of the conditions.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="conditions are the latest observations (metav1.Condition).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        None, description="observedGeneration is the last spec generation planned."
    )
    workers: WorkersStatus = Field(default_factory=WorkersStatus, description="workers are worker counts.")
    selector: str | None = Field(
        None, description="selector is the label selector of worker pods (scale subresource)."
    )
    preemptions: int = Field(
        0, description="preemptions counts pods lost to preemption, eviction or node loss."
    )
    failures: int = Field(
        0, description="failures counts pods that failed on their own (the failure budget)."
    )
    restarts: int = Field(0, description="restarts counts job restarts after failures.")
    last_checkpoint: CheckpointStatus | None = Field(
        None, description="lastCheckpoint is the newest committed checkpoint."
    )
    step: int | None = Field(None, description="step is the newest training step the coordinator reported.")
    image: str | None = Field(
        None,
        description="image is the trainer image the pods run: spec.image, or the operator's default trainer image "
        "when spec.image is unset (kept from then on, so a new operator default does not restart a running job).",
    )
    start_time: str | None = Field(
        None,
        description="startTime is when the first pods were created.",
        json_schema_extra={"format": "date-time"},
    )
    completion_time: str | None = Field(
        None,
        description="completionTime is when the job Succeeded or Failed.",
        json_schema_extra={"format": "date-time"},
    )
    last_failure: FailureStatus | None = Field(None, description="lastFailure is the last counted failure.")
    # Bookkeeping that keeps the planner idempotent across operator restarts.
    restart_generation: int = Field(
        0,
        description="restartGeneration labels the current set of pods; bumped by failure restarts and suspend.",
    )
    next_pod_index: int = Field(0, description="nextPodIndex numbers the next pod (names are never reused).")
    backoff_until: str | None = Field(
        None,
        description="backoffUntil is when the pending failure restart may create pods.",
        json_schema_extra={"format": "date-time"},
    )
    pod_template_hash: str | None = Field(
        None,
        description="podTemplateHash digests the spec the current pods were rendered from (a change restarts them).",
    )
    handled_checkpoint_request: str | None = Field(
        None,
        description="handledCheckpointRequest is the ftjob.dev/checkpoint-request value already asked for.",
    )
    suspend_requested_at: str | None = Field(
        None,
        description="suspendRequestedAt is when suspend asked for its checkpoint.",
        json_schema_extra={"format": "date-time"},
    )
    coordinator_lost_at: str | None = Field(
        None,
        description="coordinatorLostAt is when the coordinator was last lost (workers failing soon after are not blamed).",
        json_schema_extra={"format": "date-time"},
    )
    last_preemption_time: str | None = Field(
        None,
        description="lastPreemptionTime is when a preemption was last counted (trainer errors reported soon after are "
        "its consequence, not failures).",
        json_schema_extra={"format": "date-time"},
    )
    handled_error_id: int = Field(
        0,
        description="handledErrorId is the newest trainer error report (the coordinator's errors[].id) already "
        "counted as a failure or set aside (a report is never looked at twice).",
    )
    known_pods: list[str] = names_set(
        "knownPods are current pods seen alive at the last plan (a vanished one counts as lost)."
    )
    retired_pods: list[str] = names_set(
        "retiredPods are pods already counted as lost or removed on purpose (never counted twice)."
    )
    pending_pods: list[str] = names_set(
        "pendingPods are pods created but not yet seen in a list (their create is re-issued, never a second pod)."
    )
    noticed_pods: list[str] = names_set(
        "noticedPods are pods whose termination notice already triggered a checkpoint request."
    )
