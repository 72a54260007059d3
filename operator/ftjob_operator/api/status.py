"""`status`: what the operator observed, written only by it. Counters live here: an operator restart loses none.

The top level is what users read (`kubectl describe tj` sorts keys, so only nesting keeps the rest out of the way);
the operator's own bookkeeping, which keeps its passes idempotent across restarts, lives under `status.operator`.
An operator of an earlier version kept that bookkeeping at the top level: `TrainingJobStatus` reads it from there
once when `status.operator` is absent (`LEGACY_BOOKKEEPING`), so an upgrade loses no counter.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import StatusModel

ConditionType = Literal[
    "Created",
    "Running",
    "Restarting",
    "Preempted",
    "Suspended",
    "Succeeded",
    "Failed",
    "InvalidSpec",
    "CheckpointFailing",
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
    active: int = Field(0, description="active is worker pods that exist and are not lost, up to desired.")
    ready: int = Field(0, description="ready is active workers that are running, up to desired.")
    spares: int = Field(
        0,
        description="spares is worker pods beyond desired: warm spares waiting in the rendezvous (spec.workers.spares).",
    )


class CheckpointStatus(StatusModel):
    """The newest committed checkpoint the coordinator reported."""

    step: int = Field(..., description="step of the checkpoint.")
    time: str | None = Field(
        None, description="time the checkpoint was committed.", json_schema_extra={"format": "date-time"}
    )
    path: str | None = Field(None, description="path of the checkpoint directory inside the pods.")


class CheckpointFailureStatus(StatusModel):
    """The newest save the trainer dropped (a full checkpoint volume, say): training went on, and a resume would
    start from `kept`. Condition CheckpointFailing holds until a newer checkpoint commits."""

    step: int = Field(..., description="step of the save that failed.")
    kind: str | None = Field(None, description="kind of save: periodic or request.")
    message: str = Field(..., description="message says why, for each failing rank, and what to fix.")
    kept: str | None = Field(None, description="kept is the committed checkpoint a resume would load then.")
    time: str | None = Field(
        None, description="time the save failed.", json_schema_extra={"format": "date-time"}
    )


class FailureStatus(StatusModel):
    """What the last failure was (the Failed condition's message repeats it)."""

    pod: str = Field(..., description="pod that failed.")
    exit_code: int | None = Field(None, description="exitCode of its container.")
    reason: str | None = Field(None, description="reason Kubernetes or the trainer gave.")
    message: str | None = Field(None, description="message is the trainer's termination message.")
    time: str | None = Field(
        None, description="time the failure was counted.", json_schema_extra={"format": "date-time"}
    )


class LostTime(StatusModel):
    """What one cause cost: time and steps."""

    seconds: float = Field(
        0.0,
        ge=0,
        description="seconds lost: for each resume after this cause, from the last kept step (the one the resume "
        "loaded, or the previous run's first step if that is later) to the first step after the resume; this "
        "includes the time spent training the steps that were trained again.",
    )
    steps: int = Field(
        0,
        ge=0,
        description="steps trained twice: the steps a run trained after the step its successor resumed from.",
    )


class LostStatus(StatusModel):
    """Training time and steps lost, by cause."""

    preemptions: LostTime = Field(default_factory=LostTime, description="preemptions: lost to preemptions.")
    failures: LostTime = Field(default_factory=LostTime, description="failures: lost to failures.")


class ProgressStatus(StatusModel):
    """Progress, speed and goodput, from what the trainer reports (the coordinator's progress) and what the operator
    observes. Updated when the operator sees a new step and when the job ends, never more often."""

    percent: float | None = Field(
        None, ge=0, le=100, description="percent of the run's steps done (status.step / totalSteps)."
    )
    total_steps: int | None = Field(
        None, description="totalSteps is the step the run ends at (the trainer's, else spec.trainer.steps)."
    )
    eta_seconds: int | None = Field(
        None,
        ge=0,
        description="etaSeconds estimates the seconds until the last step at the recent step rate (interruptions "
        "to come are not in it).",
    )
    steps_per_second: float | None = Field(
        None, description="stepsPerSecond is the recent step rate, between the last steps the operator saw."
    )
    tokens_per_second: float | None = Field(
        None,
        description="tokensPerSecond is the trainer's recent throughput (rank 0, over its last 20 steps).",
    )
    elapsed_seconds: float = Field(
        0.0,
        ge=0,
        description="elapsedSeconds is the wall time since the job's first pods were created, up to updatedAt, "
        "not counting time suspended.",
    )
    kept_seconds: float = Field(
        0.0,
        ge=0,
        description="keptSeconds is the training time of the steps that were kept: each trainer run's time from "
        "its first step to its newest, less the time of the steps a later run trained again.",
    )
    goodput: float | None = Field(
        None,
        ge=0,
        le=1,
        description="goodput is keptSeconds / elapsedSeconds: the fraction of the job's wall time that produced "
        "training steps that were kept. Start-up, interruptions and restarts lower it.",
    )
    lost: LostStatus = Field(
        default_factory=LostStatus,
        description="lost is the training time and steps lost to preemptions and to failures, separately.",
    )
    updated_at: str | None = Field(
        None,
        description="updatedAt is when these figures were computed (a new step seen, or the end of the job).",
        json_schema_extra={"format": "date-time"},
    )


class TrainerRunStatus(StatusModel):
    """The trainer run last accounted for. A run is one rank-0 trainer process: torchrun restarts every worker on a
    membership change, so each resume is a new run."""

    started_at: str = Field(..., description="startedAt names the run: when its rank-0 process started.")
    resumed_from_step: int = Field(0, description="resumedFromStep is the step it loaded (0: a fresh start).")
    first_step_time: str = Field(..., description="firstStepTime is when it finished its first step.")
    step: int = Field(..., description="step is its newest step accounted for.")
    step_time: str = Field(..., description="stepTime is when that step finished.")


class InterruptionStatus(StatusModel):
    """The preemption or failure that resumes are charged to (status.progress.lost)."""

    cause: Literal["preemption", "failure"] = Field(..., description="cause is preemption or failure.")
    since: str = Field(
        ...,
        description="since is when it began: the termination notice, else the loss.",
        json_schema_extra={"format": "date-time"},
    )
    resumed: bool = Field(
        False, description="resumed is true once a run trained after it (its recovery time is observed once)."
    )


def names_set(description: str) -> Any:
    return Field(
        default_factory=list, description=description, json_schema_extra={"x-kubernetes-list-type": "set"}
    )


class OperatorStatus(StatusModel):
    """The operator's bookkeeping: what keeps its passes idempotent across operator restarts (never counted twice,
    never a second pod for one slot). Read by the operator only; users read the top level of the status."""

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
    world_epoch: int = Field(
        0,
        description="worldEpoch is the newest trainer world epoch the coordinator reported; a recreated coordinator "
        "starts from it, so an older world can never commit a checkpoint.",
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
    # What status.progress is accounted from (planner/progress.py).
    run: TrainerRunStatus | None = Field(None, description="run is the trainer run last accounted for.")
    interruption: InterruptionStatus | None = Field(
        None,
        description="interruption is the preemption or failure that resumes are charged to, until the job trains "
        "at its full size again.",
    )
    noticed_at: str | None = Field(
        None,
        description="noticedAt is when a termination notice was first seen since the last counted loss.",
        json_schema_extra={"format": "date-time"},
    )
    suspended_seconds: float = Field(
        0.0, ge=0, description="suspendedSeconds is the time the job spent suspended (not elapsed time)."
    )


# The bookkeeping an operator of an earlier version wrote at the top level of the status (now under
# status.operator). The CRD keeps them, marked deprecated, so the API server does not prune them before an upgraded
# operator has read them once.
LEGACY_BOOKKEEPING = (
    "restartGeneration",
    "nextPodIndex",
    "backoffUntil",
    "podTemplateHash",
    "handledCheckpointRequest",
    "suspendRequestedAt",
    "coordinatorLostAt",
    "lastPreemptionTime",
    "handledErrorId",
    "knownPods",
    "retiredPods",
    "pendingPods",
    "noticedPods",
)
LEGACY_DESCRIPTION = (
    "{name} is deprecated: it moved to status.operator.{name}. An operator upgraded from an earlier version reads it "
    "from here once, then removes it."
)


def has_legacy_bookkeeping(status: dict[str, Any] | None) -> bool:
    """A status written by an earlier operator: bookkeeping at the top level and no status.operator yet."""
    return bool(status) and "operator" not in status and any(k in status for k in LEGACY_BOOKKEEPING)


def with_legacy_bookkeeping(status: dict[str, Any]) -> dict[str, Any]:
    """The status with its bookkeeping also at the top level, for a status an earlier operator wrote. Until a read
    shows status.operator persisted, the old fields stay current: a CRD not yet upgraded (helm never upgrades CRDs)
    prunes status.operator, and the operator then keeps working from the old fields."""
    book = status.get("operator") or {}
    return {**status, **{k: book[k] for k in LEGACY_BOOKKEEPING if k in book}}


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
    last_checkpoint_failure: CheckpointFailureStatus | None = Field(
        None, description="lastCheckpointFailure is the newest save the trainer dropped."
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
    progress: ProgressStatus | None = Field(
        None,
        description="progress is how far the run is, its speed and ETA, its goodput and what preemptions and "
        "failures cost.",
    )
    operator: OperatorStatus = Field(
        default_factory=OperatorStatus,
        description="operator is the operator's own bookkeeping (what keeps it idempotent across restarts); "
        "users need not read it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_legacy_bookkeeping(cls, data: Any) -> Any:
        if isinstance(data, dict) and has_legacy_bookkeeping(data):
            return {**data, "operator": {k: data[k] for k in LEGACY_BOOKKEEPING if k in data}}
        return data
