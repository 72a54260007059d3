"""One pass's context, passed explicitly through the ordered steps (JobSet's reconcile habit), and what a pass
produces: the actions, the new status, and how the pass ended (the phase is decided from that, in summary.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ftjob_trainer import contract
from pydantic import ValidationError

from .. import api, render
from .. import conditions as cond
from .observed import (
    Nodes,
    Observed,
    loss_of,
    owned_by,
    pod_generation,
    pod_index,
    pod_name,
    pod_node,
    pod_ready,
    pod_role,
    pod_succeeded,
)

# How soon to re-plan when the next step depends on the status just written (deferred deletes, waits).
FOLLOW_UP_SECONDS = 1.0
POLL_SECONDS = 5.0


# --- what a pass produces --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Create:
    manifest: dict[str, Any]  # a 409 AlreadyExists means it is done

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]


@dataclass(frozen=True)
class Delete:
    kind: str  # Pod | TrainingJob
    name: str
    grace_period_seconds: int | None = None  # None: the object's own; 0 for pods on a node that is gone
    uid: str | None = None  # a precondition: delete only this object, never a recreated one of the same name


@dataclass(frozen=True)
class RequestCheckpoint:
    reason: str  # POST /v1/checkpoint {"reason": ...} to the coordinator


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


Action = Create | Delete | RequestCheckpoint | Event


@dataclass(frozen=True)
class Recovery:
    """A run trained again after an interruption: seconds from its notice (or the loss) to that first step."""

    cause: str  # preemption | failure
    seconds: float


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    status: dict[str, Any]
    requeue_after: float | None = None  # seconds; None: wait for the next change
    recoveries: tuple[
        Recovery, ...
    ] = ()  # observed once each (the run that ends one is persisted in the status)

    def of(self, kind: type) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]


class InvalidStatus(ValueError):
    """The job's status cannot be read (unknown fields are ignored; this is a wrong type or value). `plan` then
    plans nothing: the handler reports it and leaves the job and its pods alone until the status is fixed."""

    def __init__(self, exc: ValidationError):
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            problems.append(f"status.{loc}: {err['msg']}" if loc else f"status: {err['msg']}")
        super().__init__(
            "the status cannot be read, so nothing is changed until it is fixed (edit the status subresource "
            "or remove the offending fields): " + "; ".join(problems)
        )


class Ending(enum.Enum):
    """How a pass ended. `summary.decide_phase` turns it into status.phase, the one place that does."""

    DELETING = (
        "deleting"  # the job is being deleted (garbage collection removes the children): nothing changes
    )
    FINISHED = "finished"  # it finished in an earlier pass: clean-up and TTL only, the phase stays
    INVALID = "Invalid"
    SUSPENDING = "Suspending"  # waiting for the suspend checkpoint
    SUSPENDED = "Suspended"
    RESTARTING = "Restarting"  # a new restart generation, or the coordinator's backoff, just began
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    FROM_PODS = "from pods"  # the phase follows from what runs: Running, Pending, or Restarting until it runs


# --- the context -----------------------------------------------------------------------------------------------
class Context:
    """Everything one pass reads and writes. Reads: `o` (the observations), `now`, `prev` (the persisted status),
    `spec` (set once validated), the job's pods sorted out once (`current` generation, `old` ones, `by_name`).
    Writes: `st` (a copy of the status), `conds`, and the actions, events and requeue that `plan()` returns."""

    def __init__(self, observed: Observed, now: datetime):
        self.o = observed
        self.now = now
        self.now_s = contract.format_time(now)
        job = observed.job
        self.meta: dict[str, Any] = job.get("metadata") or {}
        self.ref = render.JobRef.from_object(job)
        self.generation: int | None = self.meta.get("generation")
        try:
            self.prev = api.parse_status(job.get("status"))
        except ValidationError as exc:
            # Starting over from an empty status would reset the counters and delete the running pods.
            raise InvalidStatus(exc) from exc
        self.st = self.prev.model_copy(deep=True)
        self.conds: list[dict[str, Any]] = [c.to_json() for c in self.st.conditions]
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue: float | None = None
        self.recoveries: list[Recovery] = []
        self.nodes = Nodes(observed.nodes, observed.extra_termination_taints)
        self.spec: api.TrainingJobSpec | None = None  # set by the validation step
        # The job's children, sorted out once: only pods it owns, by index.
        owned = [p for p in observed.pods if owned_by(p, self.ref.uid)]
        pods = sorted(owned, key=lambda p: (pod_index(p), pod_name(p)))
        self.by_name = {pod_name(p): p for p in pods}
        self.current = [p for p in pods if pod_generation(p) == self.prev.operator.restart_generation]
        self.old = [p for p in pods if pod_generation(p) != self.prev.operator.restart_generation]
        self.max_index = max([pod_index(p) for p in pods] + [-1])

    # -- events, conditions, requeue
    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def condition(self, type_: str, status: str, reason: str, message: str = "") -> None:
        self.conds = cond.set_condition(
            self.conds, type_, status, reason, message, now=self.now_s, generation=self.generation
        )

    def clear(self, type_: str, reason: str, message: str = "") -> None:
        """Set False only if the condition exists (absent conditions stay absent)."""
        if cond.find(self.conds, type_) is not None:
            self.condition(type_, cond.FALSE, reason, message)

    def requeue_in(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    # -- the current generation's pods
    def alive(self, role: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.current
            if pod_role(p) == role and loss_of(p, self.nodes) is None and not pod_succeeded(p)
        ]

    def placed_ready(self, pod: dict[str, Any]) -> bool:
        """Ready, on a node that is not NotReady: a pod whose node stopped reporting counts as placed no more
        (nor as lost: the node may come back; the node lifecycle controller evicts it if not)."""
        return pod_ready(pod) and not self.nodes.not_ready(pod_node(pod))

    def live_pods(self) -> list[dict[str, Any]]:
        return self.alive(render.ROLE_WORKER) + self.alive(render.ROLE_COORDINATOR)

    def is_worker_name(self, name: str) -> bool:
        return name.startswith(f"{self.ref.name}-worker-")

    def delete_pod(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        deleting = contract.parse_time(meta.get("deletionTimestamp"))
        if deleting is None:
            self.actions.append(Delete("Pod", pod_name(pod)))
            return
        # deletionTimestamp is when the grace period ends. A pod whose node is gone has no kubelet to finish the
        # delete: remove the object once its grace is over (never earlier: it may still be saving a checkpoint).
        node_gone = self.nodes.gone(pod_node(pod))
        if node_gone and self.now >= deleting and meta.get("deletionGracePeriodSeconds") != 0:
            self.actions.append(Delete("Pod", pod_name(pod), 0))

    # -- the result
    def plan(self) -> Plan:
        self.st.conditions = [api.Condition.model_validate(c) for c in self.conds]
        if self.generation is not None:
            self.st.observed_generation = self.generation
        status = self.st.to_json()
        if api.has_legacy_bookkeeping(self.o.job.get("status")):
            status = api.with_legacy_bookkeeping(status)  # until status.operator is seen persisted
        return Plan(tuple(self.actions) + tuple(self.events), status, self.requeue, tuple(self.recoveries))
