"""The pure planner: `plan(observed, now) -> Plan(actions, status)`. No I/O, no clock, no randomness.

Written like JobSet's reconcile: ordered steps with early returns, one function per policy (finished/TTL, invalid
spec, suspend, success, lost pods = preemption or failure, backoff, checkpoint requests, children). The handlers
gather an `Observed`, call `plan`, write `Plan.status` (the whole status, see `status_patch`), then emit the
events, then apply the actions in order.

The handler's side, in order:
1. Observe: the job; every pod labelled ftjob.dev/job-name=<job> (all restart generations, fresh from the API
   when possible); the nodes that exist (or None or []: then "node gone" is never concluded; a node missing
   from a non-empty list is taken as known gone); the Service `<job>-coordinator`;
   whether the Secret `<job>-token` exists; the coordinator's GET /v1/progress when it answers; a fresh random
   token (used only if the Secret must be created).
2. Write `Plan.status` to the status subresource (`status_patch(old, new)` gives a merge patch that also
   removes keys); only after that succeeds emit the Events (so each transition is announced once), then apply
   the Create/Delete/RequestCheckpoint actions in order (Create: 409 means done; Delete: 404 means done, and with
   `uid` a 409 too; RequestCheckpoint: POST /v1/checkpoint on http://<clusterIP>:29401 with the bearer token,
   best effort).
3. Re-run after `requeue_after` seconds when it is set, and on a timer anyway to poll progress.

Idempotency (an operator restart at any instant creates no duplicates and loses no counter):
- every counter and every "already handled" mark lives in the returned status;
- pod names come from `status.nextPodIndex` and the largest index observed, and a created pod stays in
  `status.pendingPods` (its Create re-issued; a 409 means done) until a list shows it, so a stale list never
  makes a second pod;
- a pod is deleted only when the *persisted* status already accounts for it (retired, of an older restart
  generation, or the job finished), so a crash between delete and status write cannot hide a loss.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from ftjob_trainer import contract
from pydantic import ValidationError

from . import api, render
from . import conditions as cond

# Node taints that announce the node's termination (spot notice, autoscaler scale-down, GKE shutdown).
TERMINATION_TAINTS = frozenset(
    {
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/scheduled-maintenance",
        "aws-node-termination-handler/asg-lifecycle-termination",
        "ToBeDeletedByClusterAutoscaler",
        "cloud.google.com/impending-node-termination",
    }
)
# pod.status.reason values the kubelet/node lifecycle give pods they stop for reasons outside the pod.
PREEMPTION_POD_REASONS = frozenset(
    {"Evicted", "Preempting", "NodeLost", "Terminated", "Shutdown", "NodeShutdown"}
)
# Waiting reasons that will not fix themselves: count as a failure instead of waiting forever.
FATAL_WAITING_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
SIGNAL_EXIT_CODES = frozenset({128 + 15, 128 + 9})  # SIGTERM, SIGKILL
TRAINER_PREEMPTED_REASONS = frozenset(
    {contract.REASON_PREEMPTED, contract.REASON_PEER, contract.REASON_DEADLINE}
)
# Workers that stop within this long after the coordinator was lost are its collateral, not failures.
COORDINATOR_COLLATERAL_SECONDS = 120
# Trainer errors reported within this long after a preemption are its consequence (a peer vanished in the middle
# of a collective), not failures. A trainer that keeps crashing reports again later, and that report counts.
PREEMPTION_COLLATERAL_SECONDS = 60
# lastFailure.reason of a failure the trainer reported (coordinator /v1/error) while its pod kept running.
REASON_TRAINER_ERROR = "TrainerError"
# How soon to re-plan when the next step depends on the status just written (deferred deletes, waits).
FOLLOW_UP_SECONDS = 1.0
POLL_SECONDS = 5.0
MAX_MESSAGE = 512


# --- inputs and outputs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observed:
    """What the handler saw, as Kubernetes JSON (camelCase dicts)."""

    job: dict[
        str, Any
    ]  # the TrainingJob: metadata (uid, generation, annotations, deletionTimestamp), spec, status
    pods: list[dict[str, Any]] = field(
        default_factory=list
    )  # pods labelled ftjob.dev/job-name=<job>, any generation
    nodes: list[dict[str, Any]] | None = (
        None  # every node; None when unknown (then "node gone" is never concluded)
    )
    service: dict[str, Any] | None = None  # the coordinator Service, if it exists
    secret_exists: bool = False
    progress: dict[str, Any] | None = None  # GET /v1/progress from the coordinator, when it answered
    new_token: str = ""  # a fresh random token, used only when the Secret has to be created
    # The operator's default trainer image (env FTJOB_DEFAULT_TRAINER_IMAGE, set by the chart), for jobs without
    # spec.image; "" when the operator has none.
    default_image: str = ""


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
class Plan:
    actions: tuple[Action, ...]
    status: dict[str, Any]
    requeue_after: float | None = None  # seconds; None: wait for the next change

    def of(self, kind: type) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]


# --- time ------------------------------------------------------------------------------------------------------
def fmt_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(timezone.utc)


def backoff_seconds(policy: api.FailurePolicySpec, uid: str, failures: int) -> float:
    """Exponential backoff with jitter; the jitter is a hash of (uid, failures), so the planner stays pure."""
    delay = min(float(policy.backoff_max_seconds), policy.backoff_base_seconds * 2.0 ** max(0, failures - 1))
    u = int(hashlib.sha256(f"{uid}/{failures}".encode()).hexdigest()[:8], 16) / 2**32
    return delay * (1.0 - policy.jitter * u)


# --- pod and node reading --------------------------------------------------------------------------------------
def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def pod_name(pod: dict[str, Any]) -> str:
    return pod["metadata"]["name"]


def owned_by(pod: dict[str, Any], uid: str | None) -> bool:
    """The one ownership rule: a pod is the job's only if an ownerReference names the job's uid. Labels alone are
    not enough: an orphaned pod (cascade=orphan) or a pod of an earlier job of the same name carries them too."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(o.get("uid") == uid for o in owners)


def pod_role(pod: dict[str, Any]) -> str:
    return _labels(pod).get(render.LABEL_ROLE, "")


def pod_generation(pod: dict[str, Any]) -> int:
    try:
        return int(_labels(pod).get(render.LABEL_RESTART_GENERATION, "-1"))
    except ValueError:
        return -1


def pod_index(pod: dict[str, Any]) -> int:
    try:
        return int(_labels(pod).get(render.LABEL_POD_INDEX, "-1"))
    except ValueError:
        return -1


def _pod_conditions(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return (pod.get("status") or {}).get("conditions") or []


def has_disruption_target(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in _pod_conditions(pod)
    )


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The main container's `state.terminated` (exitCode, reason, message), if it ended."""
    return (_container_status(pod).get("state") or {}).get("terminated")


def fatal_waiting_reason(pod: dict[str, Any]) -> str | None:
    waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
    return waiting.get("reason") if waiting.get("reason") in FATAL_WAITING_REASONS else None


def termination_message(pod: dict[str, Any]) -> dict[str, Any]:
    """The trainer's JSON termination message (contract.py), or {"message": text} when it is not JSON."""
    text = (terminated(pod) or {}).get("message") or ""
    if not text:
        return {}
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else {"message": text}
    except json.JSONDecodeError:
        return {"message": text[-MAX_MESSAGE:]}


def pod_succeeded(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    t = terminated(pod)
    return phase == "Succeeded" or (phase != "Failed" and t is not None and t.get("exitCode") == 0)


def pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    ready = next((c for c in _pod_conditions(pod) if c.get("type") == "Ready"), None)
    return ready is None or ready.get("status") == "True"


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


class Nodes:
    """Node existence and termination taints; knows nothing when the handler did not list nodes."""

    def __init__(self, nodes: list[dict[str, Any]] | None):
        # An empty list is an index not synced yet (a cluster running our pods has nodes): concluding "every
        # node gone" from it would retire every pod.
        self.known = bool(nodes)
        self.by_name = {n["metadata"]["name"]: n for n in nodes or []}

    def gone(self, name: str | None) -> bool:
        return bool(name) and self.known and name not in self.by_name

    def termination_taint(self, name: str | None) -> str | None:
        node = self.by_name.get(name or "")
        for taint in ((node or {}).get("spec") or {}).get("taints") or []:
            if taint.get("key") in TERMINATION_TAINTS:
                return taint["key"]
        return None


def notice_of(pod: dict[str, Any], nodes: Nodes) -> str | None:
    """Why this pod is about to be stopped from outside, or None."""
    node = (pod.get("spec") or {}).get("nodeName")
    if has_disruption_target(pod):
        c = next(c for c in _pod_conditions(pod) if c.get("type") == "DisruptionTarget")
        return f"DisruptionTarget ({c.get('reason') or 'no reason'})"
    taint = nodes.termination_taint(node)
    if taint:
        return f"node {node} tainted {taint}"
    return None


def loss_of(pod: dict[str, Any], nodes: Nodes) -> str | None:
    """Why this pod no longer counts as a live member (it may still be terminating), or None if it is alive."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if pod_succeeded(pod):
        return None
    if meta.get("deletionTimestamp"):
        return "deleted"
    if status.get("phase") == "Failed":
        return "failed"
    if nodes.gone(node):
        return "node gone"
    reason = fatal_waiting_reason(pod)
    if reason:
        return reason
    return None


@dataclass(frozen=True)
class Loss:
    pod: str
    role: str
    preemption: bool
    why: str
    exit_code: int | None = None
    message: str = ""


def classify(pod: dict[str, Any], nodes: Nodes, noticed: set[str]) -> Loss:
    """Preemption (never uses the failure budget) or failure, with the evidence in words."""
    name, role = pod_name(pod), pod_role(pod)
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    t = terminated(pod) or {}
    exit_code = t.get("exitCode")
    tm = termination_message(pod)
    trainer_msg = tm.get("message") or ""
    notice = notice_of(pod, nodes) or ("termination notice seen earlier" if name in noticed else None)

    def preempted(why: str) -> Loss:
        return Loss(name, role, True, why, exit_code, trainer_msg)

    if notice:
        return preempted(notice)
    if nodes.gone(node):
        return preempted(f"node {node} is gone")
    if status.get("reason") in PREEMPTION_POD_REASONS:
        return preempted(f"pod {status['reason']}: {status.get('message') or ''}".strip())
    if tm.get("reason") in TRAINER_PREEMPTED_REASONS:
        return preempted(f"trainer stopped: {tm['reason']}")
    if (pod.get("metadata") or {}).get("deletionTimestamp") and not t:
        return preempted("deleted while running (not by ftjob)")
    if (pod.get("metadata") or {}).get("deletionTimestamp") and exit_code in SIGNAL_EXIT_CODES:
        return preempted(f"deleted, exit code {exit_code}")
    waiting = fatal_waiting_reason(pod)
    if waiting:
        msg = ((_container_status(pod).get("state") or {}).get("waiting") or {}).get("message") or ""
        return Loss(name, role, False, waiting, None, msg[:MAX_MESSAGE])
    why = t.get("reason") or "Error"
    return Loss(name, role, False, why, exit_code, (trainer_msg or t.get("message") or "")[:MAX_MESSAGE])


# --- spec checks the schema cannot express ---------------------------------------------------------------------
RESERVED_TRAINER_FLAGS = frozenset(
    {
        "checkpoint-dir",
        "checkpoint-every",
        "keep-last",
        "save-deadline-seconds",
        "coordinator-url",
        "memory-checkpoint-dir",
    }
)
_FLAG_RE = re.compile(r"^[a-z][a-z0-9-]*$")


def spec_problems(name: str, spec: api.TrainingJobSpec) -> list[str]:
    """What to fix, one line each; empty when the spec is usable."""
    problems: list[str] = []
    if len(name) > api.MAX_JOB_NAME_LENGTH or not re.match(api.JOB_NAME_PATTERN, name):
        problems.append(
            f"metadata.name {name!r} must be a DNS-1035 label of at most {api.MAX_JOB_NAME_LENGTH} characters "
            "(it names the Service <name>-coordinator)"
        )
    if spec.command is not None and not spec.command:
        problems.append(
            "spec.command is empty: remove it for the built-in trainer or name a script or ['-m', 'module']"
        )
    tpl = spec.pod_template
    for i, env in enumerate(tpl.env or []):
        n = env.get("name")
        if not isinstance(n, str) or not n:
            problems.append(f"spec.podTemplate.env[{i}] needs a name")
        elif n in render.RESERVED_ENV:
            problems.append(f"spec.podTemplate.env[{i}].name {n} is set by the operator; use another name")
    volume_names = {render.CHECKPOINT_VOLUME, render.SHM_VOLUME}
    for i, vol in enumerate(tpl.volumes or []):
        n = vol.get("name")
        if not isinstance(n, str) or not n:
            problems.append(f"spec.podTemplate.volumes[{i}] needs a name")
        elif n in render.RESERVED_VOLUMES:
            problems.append(f"spec.podTemplate.volumes[{i}].name {n} is taken by ftjob; rename it")
        elif n in volume_names:
            problems.append(f"spec.podTemplate.volumes[{i}].name {n} appears twice")
        else:
            volume_names.add(n)
    for i, mount in enumerate(tpl.volume_mounts or []):
        if mount.get("name") not in volume_names:
            problems.append(
                f"spec.podTemplate.volumeMounts[{i}] mounts volume {mount.get('name')!r}, which no volume defines"
            )
        if mount.get("mountPath") in (spec.checkpoint.mount_path, "/dev/shm"):
            problems.append(
                f"spec.podTemplate.volumeMounts[{i}].mountPath {mount.get('mountPath')} is used by ftjob; pick another path"
            )
    for key in tpl.labels or {}:
        if key.startswith("ftjob.dev/"):
            problems.append(f"spec.podTemplate.labels {key}: ftjob.dev/* labels belong to the operator")
    for flag in spec.trainer.flags or {}:
        if not _FLAG_RE.match(flag):
            problems.append(
                f"spec.trainer.flags key {flag!r} must look like a flag name without dashes, e.g. warmup-steps"
            )
        elif flag in RESERVED_TRAINER_FLAGS:
            problems.append(f"spec.trainer.flags {flag} is set from spec.checkpoint/preemption; set it there")
    return problems


def _validation_problems(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        out.append(f"spec.{loc}: {msg}" if loc else f"spec: {msg}")
    return out


# --- the plan --------------------------------------------------------------------------------------------------
class _Planner:
    """One planning pass. Collects actions and mutates a copy of the status; `plan()` is the public entry."""

    def __init__(self, observed: Observed, now: datetime):
        self.o = observed
        self.now = now
        self.now_s = fmt_time(now)
        job = observed.job
        meta = job.get("metadata") or {}
        self.meta = meta
        self.ref = render.JobRef.from_object(job)
        self.generation = meta.get("generation")
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
        self.nodes = Nodes(observed.nodes)
        self.spec: api.TrainingJobSpec | None = None

    # -- helpers
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

    def result(self) -> Plan:
        self.st.conditions = [api.Condition.model_validate(c) for c in self.conds]
        if self.generation is not None:
            self.st.observed_generation = self.generation
        return Plan(tuple(self.actions) + tuple(self.events), self.st.to_json(), self.requeue)

    # -- children of the job, sorted out once
    def sort_pods(self) -> None:
        gen = self.prev.restart_generation
        owned = [p for p in self.o.pods if owned_by(p, self.ref.uid)]
        pods = sorted(owned, key=lambda p: (pod_index(p), pod_name(p)))
        self.by_name = {pod_name(p): p for p in pods}
        self.current = [p for p in pods if pod_generation(p) == gen]
        self.old = [p for p in pods if pod_generation(p) != gen]
        self.max_index = max([pod_index(p) for p in pods] + [-1])

    def alive(self, role: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.current
            if pod_role(p) == role and loss_of(p, self.nodes) is None and not pod_succeeded(p)
        ]

    def delete_pod(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        deleting = parse_time(meta.get("deletionTimestamp"))
        if deleting is None:
            self.actions.append(Delete("Pod", pod_name(pod)))
            return
        # deletionTimestamp is when the grace period ends. A pod whose node is gone has no kubelet to finish the
        # delete: remove the object once its grace is over (never earlier: it may still be saving a checkpoint).
        node_gone = self.nodes.gone((pod.get("spec") or {}).get("nodeName"))
        if node_gone and self.now >= deleting and meta.get("deletionGracePeriodSeconds") != 0:
            self.actions.append(Delete("Pod", pod_name(pod), 0))

    def delete_old_generation(self) -> None:
        # Older generations are accounted for by the persisted restartGeneration: safe to delete.
        for pod in self.old:
            self.delete_pod(pod)

    # -- the steps ---------------------------------------------------------------------------------------------
    def run(self) -> Plan:
        if self.meta.get("deletionTimestamp"):
            return self.result()  # garbage collection removes the children
        self.sort_pods()
        if self.prev.phase in api.FINISHED_PHASES:
            return self.finished()
        if not self.validate():
            return self.result()
        self.read_progress()
        self.st.selector = render.worker_selector(self.ref.name)
        self.delete_old_generation()
        self.forget_observed_pending()
        if self.spec.suspend:
            return self.suspend()
        self.resume_if_suspended()
        if self.template_changed():
            return self.result()
        if self.success():
            return self.result()
        if self.account_losses():
            return self.result()
        if self.backoff_pending():
            return self.result()
        self.checkpoint_requests()
        self.ensure_children()
        self.summarize()
        return self.result()

    # step: finished jobs only clean up and honour the TTL
    def finished(self) -> Plan:
        spec = self._try_spec()
        clean_all = spec is None or spec.clean_pod_policy == "All"
        for pod in self.by_name.values():
            ended = pod_succeeded(pod) or (pod.get("status") or {}).get("phase") == "Failed"
            if clean_all or not ended or pod_role(pod) == render.ROLE_COORDINATOR:
                self.delete_pod(pod)
        ttl = spec.ttl_seconds_after_finished if spec else None
        done_at = parse_time(self.prev.completion_time)
        if ttl is not None and done_at is not None:
            expires = done_at + timedelta(seconds=ttl)
            if self.now >= expires:
                self.actions.append(Delete(api.KIND, self.ref.name, uid=self.ref.uid or None))
                self.event(cond.NORMAL, cond.REASON_TTL_EXPIRED, f"deleted {ttl}s after it finished")
            else:
                self.requeue_in((expires - self.now).total_seconds())
        self.st.workers = api.WorkersStatus(desired=self.st.workers.desired, active=0, ready=0)
        self.st.known_pods, self.st.pending_pods = [], []
        self.st.noticed_pods = [n for n in self.st.noticed_pods if n in self.by_name]
        self.st.retired_pods = [n for n in self.st.retired_pods if n in self.by_name]
        return self.result()

    def _try_spec(self) -> api.TrainingJobSpec | None:
        try:
            return api.parse_spec(self.o.job.get("spec") or {})
        except ValidationError:
            return None

    def finish(self, phase: str, reason: str, message: str) -> None:
        """Succeeded or Failed: terminal. Pods are deleted on the next pass (after this status is persisted)."""
        self.st.phase = phase
        self.st.completion_time = self.now_s
        self.condition(phase, cond.TRUE, reason, message)
        self.clear(cond.RUNNING, cond.REASON_FINISHED, f"the job {phase.lower()}")
        self.clear(cond.RESTARTING, cond.REASON_FINISHED, f"the job {phase.lower()}")
        self.st.backoff_until = None
        self.event(cond.NORMAL if phase == "Succeeded" else cond.WARNING, reason, message)
        self.requeue_in(FOLLOW_UP_SECONDS)

    # step: InvalidSpec (what the schema cannot catch, or a server that does not validate)
    def validate(self) -> bool:
        try:
            spec = api.parse_spec(self.o.job.get("spec") or {})
            problems = spec_problems(self.ref.name, spec)
        except ValidationError as exc:
            spec, problems = None, _validation_problems(exc)
        image = self.resolve_image(spec) if spec is not None else None
        if spec is not None and not image:
            problems.append(
                "spec.image is not set and the operator has no default trainer image: set spec.image, or give the "
                "operator one (helm value trainer.image.repository/tag, env FTJOB_DEFAULT_TRAINER_IMAGE)"
            )
        if problems:
            message = "; ".join(problems)
            was = cond.find(self.conds, cond.INVALID_SPEC)
            if not was or was.get("status") != cond.TRUE or was.get("message") != message:
                self.event(cond.WARNING, cond.REASON_INVALID_SPEC, message)
            self.condition(cond.INVALID_SPEC, cond.TRUE, cond.REASON_INVALID_SPEC, message)
            self.st.phase = "Invalid"
            return False
        if cond.is_true(self.conds, cond.INVALID_SPEC):
            self.condition(cond.INVALID_SPEC, cond.FALSE, cond.REASON_SPEC_VALID, "the spec is valid now")
            self.st.phase = None
        # Render from the resolved image, and keep it: the pods (and the template hash) stay on it.
        self.spec = spec.model_copy(update={"image": image})
        self.st.image = image
        self.st.workers.desired = spec.workers.desired
        return True

    def resolve_image(self, spec: api.TrainingJobSpec) -> str | None:
        """spec.image; else the image this job already runs (an operator upgrade with a new default must not
        restart it); else the operator's default."""
        return spec.image or self.prev.image or self.o.default_image or None

    def read_progress(self) -> None:
        p = self.o.progress or {}
        if isinstance(p.get("step"), int):
            self.st.step = p["step"]
        ck = p.get("lastCheckpoint")
        if isinstance(ck, dict) and isinstance(ck.get("step"), int):
            old = self.st.last_checkpoint
            if old is None or ck["step"] >= old.step:
                self.st.last_checkpoint = api.CheckpointStatus(
                    step=ck["step"], time=ck.get("time"), path=ck.get("path")
                )

    def forget_observed_pending(self) -> None:
        self.st.pending_pods = [n for n in self.st.pending_pods if n not in self.by_name]

    # step: suspend (checkpoint, bounded wait, delete pods) and resume
    def suspend(self) -> Plan:
        spec = self.spec
        workers = self.alive(render.ROLE_WORKER)
        coordinator = self.alive(render.ROLE_COORDINATOR)
        live = workers + coordinator
        self.st.workers = api.WorkersStatus(
            desired=0, active=len(workers), ready=sum(map(pod_ready, workers))
        )
        if not live and not self.st.pending_pods:
            if self.st.phase != "Suspended":
                self.event(
                    cond.NORMAL,
                    cond.REASON_SUSPENDED,
                    "no pods run; the job keeps its checkpoints and counters",
                )
            self.st.phase = "Suspended"
            self.condition(cond.SUSPENDED, cond.TRUE, cond.REASON_SUSPENDED, "spec.suspend is true")
            self.clear(cond.RUNNING, cond.REASON_SUSPENDED, "suspended")
            self.st.known_pods = []
            return self.result()
        requested = parse_time(self.st.suspend_requested_at)
        can_ask = bool(workers) and any(pod_ready(p) for p in coordinator)
        if requested is None and can_ask:
            self.st.suspend_requested_at = self.now_s
            self.actions.append(RequestCheckpoint("suspend"))
            self.event(cond.NORMAL, cond.REASON_CHECKPOINT_REQUESTED, "checkpoint before suspending")
            self.st.phase = "Suspending"
            self.condition(
                cond.SUSPENDED, cond.FALSE, cond.REASON_SUSPENDING, "waiting for the suspend checkpoint"
            )
            self.requeue_in(POLL_SECONDS)
            return self.result()
        if requested is not None:
            ck = self.st.last_checkpoint
            saved = (
                ck is not None
                and (parse_time(ck.time) or datetime.min.replace(tzinfo=timezone.utc)) >= requested
            )
            deadline = requested + timedelta(seconds=spec.checkpoint.suspend_timeout_seconds)
            if not saved and self.now < deadline:
                self.requeue_in(min(POLL_SECONDS, (deadline - self.now).total_seconds()))
                return self.result()
            how = (
                f"checkpoint at step {ck.step}"
                if saved and ck
                else "no checkpoint within suspendTimeoutSeconds"
            )
        else:
            how = "no coordinator to checkpoint"
        # A new restart generation: the current pods become old ones, deleted next pass and never counted as lost.
        self.st.restart_generation += 1
        self.st.pending_pods = []
        self.st.known_pods = []
        self.st.phase = "Suspended"
        self.condition(cond.SUSPENDED, cond.TRUE, cond.REASON_SUSPENDED, f"spec.suspend is true ({how})")
        self.clear(cond.RUNNING, cond.REASON_SUSPENDED, "suspended")
        self.event(cond.NORMAL, cond.REASON_SUSPENDED, f"deleting pods ({how})")
        self.requeue_in(FOLLOW_UP_SECONDS)
        return self.result()

    def resume_if_suspended(self) -> None:
        if self.st.phase in ("Suspended", "Suspending") or self.st.suspend_requested_at:
            self.st.suspend_requested_at = None
            self.st.phase = None
            self.condition(cond.SUSPENDED, cond.FALSE, cond.REASON_RESUMED, "spec.suspend is false")
            self.event(cond.NORMAL, cond.REASON_RESUMED, "resuming from the latest checkpoint")

    # step: an edited pod template (image, min/max, trainer settings, ...) restarts the pods
    def template_changed(self) -> bool:
        digest = render.template_hash(self.ref, self.spec)
        before, self.st.pod_template_hash = self.st.pod_template_hash, digest
        live = self.alive(render.ROLE_WORKER) + self.alive(render.ROLE_COORDINATOR)
        if before is None or before == digest or not (live or self.st.pending_pods):
            return False
        # A new generation: the current pods are deleted next pass; SIGTERM makes the trainer checkpoint first.
        self.st.restart_generation += 1
        self.st.pending_pods, self.st.known_pods = [], []
        self.st.phase = "Restarting"
        message = (
            f"the pod template changed (generation {self.generation}); restarting from the latest checkpoint"
        )
        self.condition(cond.RESTARTING, cond.TRUE, cond.REASON_SPEC_CHANGED, message)
        self.clear(cond.RUNNING, cond.REASON_SPEC_CHANGED, "restarting with the new spec")
        self.event(cond.NORMAL, cond.REASON_SPEC_CHANGED, message)
        self.summarize()
        self.requeue_in(FOLLOW_UP_SECONDS)
        return True

    # step: success when workers exit 0 (torchrun exits 0 only after the last step)
    def success(self) -> bool:
        # The trainer exits 0 only after the job's last step (a collective one), and torchrun exits 0 only when
        # its workers did: one worker pod that exits 0 proves the job is done. Waiting for the others can take
        # torchrun's exit barrier (300 s) when a peer was lost near the end; they are deleted next pass instead.
        workers = [p for p in self.current if pod_role(p) == render.ROLE_WORKER]
        done = [p for p in workers if pod_succeeded(p)]
        if not done:
            return False
        self.finish("Succeeded", cond.REASON_SUCCEEDED, f"{pod_name(done[0])} exited 0 after the last step")
        self.summarize()
        return True

    # step: lost pods -> preemption policy or failure policy
    def account_losses(self) -> bool:
        """Count every newly lost pod once. True when the pass ends here (failed, or restarting)."""
        spec = self.spec
        retired = set(self.st.retired_pods)
        noticed = set(self.st.noticed_pods)
        losses: list[Loss] = []
        for pod in self.current:
            if pod_name(pod) in retired:
                continue
            if loss_of(pod, self.nodes) is not None:
                losses.append(classify(pod, self.nodes, noticed))
        # Known pods that vanished without us seeing them stop: deleted by someone else.
        for name in self.st.known_pods:
            if name not in self.by_name and name not in retired:
                role = render.ROLE_COORDINATOR if not self.is_worker_name(name) else render.ROLE_WORKER
                losses.append(Loss(name, role, True, "deleted (gone before ftjob saw it stop)"))
        if not losses:
            error = self.trainer_error(None)
            return self.fail_or_restart(error) if error else False
        coordinator_lost_at = parse_time(self.st.coordinator_lost_at)
        # Before the loop: losses go by pod index, and a replaced coordinator's index is above the workers', yet
        # workers lost in the same pass are its collateral either way.
        if any(loss.role == render.ROLE_COORDINATOR for loss in losses):
            self.st.coordinator_lost_at = self.now_s
            coordinator_lost_at = self.now
        failure: Loss | None = None
        for loss in losses:
            self.st.retired_pods.append(loss.pod)
            if loss.preemption:
                self.st.preemptions += 1
                self.st.last_preemption_time = self.now_s
                self.condition(cond.PREEMPTED, cond.TRUE, cond.REASON_PREEMPTED, f"{loss.pod}: {loss.why}")
                self.event(
                    cond.WARNING, cond.REASON_PREEMPTED, f"{loss.role} {loss.pod} preempted: {loss.why}"
                )
            elif loss.role == render.ROLE_WORKER and self.coordinator_collateral(coordinator_lost_at):
                self.event(
                    cond.NORMAL,
                    cond.REASON_LOST_WITH_COORDINATOR,
                    f"worker {loss.pod} stopped ({loss.why}, exit code {loss.exit_code}) after the coordinator was lost; replacing it",
                )
            elif failure is None:
                failure = loss  # one failure per pass: peers that fail with it are its consequence
            else:
                self.event(
                    cond.NORMAL, cond.REASON_WORKER_FAILED, f"{loss.pod} stopped along with {failure.pod}"
                )
        max_pre = spec.preemption.max_preemptions
        if max_pre is not None and self.st.preemptions > max_pre:
            self.finish(
                "Failed",
                cond.REASON_PREEMPTION_LIMIT,
                f"{self.st.preemptions} preemptions exceed spec.preemption.maxPreemptions={max_pre}",
            )
            self.summarize()
            return True
        error = self.trainer_error(failure)
        if failure is None and error is None:
            return False
        return self.fail_or_restart(failure or error)

    def trainer_error(self, failure: Loss | None) -> Loss | None:
        """The first new error report (coordinator progress `errors`) of a live worker of this generation, as a
        failure. torchrun restarts a crashed trainer inside its pod (its restart budget stays huge for exit 75), so
        the pod never fails: this report is the only sign. Every report seen is marked handled, counted or not."""
        progress = self.o.progress or {}
        reports = progress.get("errors")
        if not isinstance(reports, list):
            reports = [progress["lastError"]] if isinstance(progress.get("lastError"), dict) else []
        fresh = [
            r
            for r in reports
            if isinstance(r, dict) and isinstance(r.get("id"), int) and r["id"] > self.st.handled_error_id
        ]
        if not fresh:
            return None
        self.st.handled_error_id = max(r["id"] for r in fresh)
        # Reports of pods already counted, retired, or of an older generation (the restart answered them) are done.
        retired = set(self.st.retired_pods)
        live = {pod_name(p) for p in self.alive(render.ROLE_WORKER)} - retired
        mine = [r for r in fresh if r.get("pod") in live]
        if not mine:
            return None
        r = mine[0]  # the oldest: peers whose collectives broke with it report after it
        where = f"rank {r.get('rank')}" + (
            f" after step {r['step']}" if isinstance(r.get("step"), int) else ""
        )
        message = f"{where}: {r.get('message') or 'no message'}"[:MAX_MESSAGE]
        exit_code = r.get("exitCode") if isinstance(r.get("exitCode"), int) else None
        said = f"{r['pod']} reported an error (exit code {exit_code}, {message})"
        if failure is not None:
            self.event(cond.NORMAL, cond.REASON_WORKER_FAILED, f"{said} along with {failure.pod}")
            return None
        preempted_at = parse_time(self.st.last_preemption_time)
        if preempted_at and (self.now - preempted_at).total_seconds() <= PREEMPTION_COLLATERAL_SECONDS:
            self.event(
                cond.NORMAL, cond.REASON_PREEMPTED, f"{said} after a preemption; not counted as a failure"
            )
            return None
        if self.coordinator_collateral(parse_time(self.st.coordinator_lost_at)):
            self.event(
                cond.NORMAL, cond.REASON_LOST_WITH_COORDINATOR, f"{said} after the coordinator was lost"
            )
            return None
        return Loss(r["pod"], render.ROLE_WORKER, False, REASON_TRAINER_ERROR, exit_code, message)

    def coordinator_collateral(self, lost_at: datetime | None) -> bool:
        """Workers that stop while the coordinator is down, or soon after it came back, are not to blame."""
        if lost_at is None:
            return False
        backoff = parse_time(self.st.backoff_until)
        recovering = backoff is not None and self.now < backoff + timedelta(
            seconds=COORDINATOR_COLLATERAL_SECONDS
        )
        return recovering or (self.now - lost_at).total_seconds() <= COORDINATOR_COLLATERAL_SECONDS

    def fail_or_restart(self, loss: Loss) -> bool:
        policy = self.spec.failure_policy
        self.st.failures += 1
        self.st.last_failure = api.FailureStatus(
            pod=loss.pod,
            exit_code=loss.exit_code,
            reason=loss.why,
            message=loss.message or None,
            time=self.now_s,
        )
        described = f"{loss.role} {loss.pod} failed: {loss.why}, exit code {loss.exit_code}" + (
            f", message: {loss.message}" if loss.message else ""
        )
        if self.st.failures > policy.max_failures:
            self.finish(
                "Failed",
                cond.REASON_BACKOFF_LIMIT,
                f"failure {self.st.failures} exceeds spec.failurePolicy.maxFailures={policy.max_failures}: {described}",
            )
            self.summarize()
            return True
        reason = (
            cond.REASON_WORKER_FAILED if loss.role == render.ROLE_WORKER else cond.REASON_COORDINATOR_FAILED
        )
        self.event(cond.WARNING, reason, f"{described} ({self.st.failures}/{policy.max_failures} failures)")
        delay = backoff_seconds(policy, self.ref.uid, self.st.failures)
        until = self.now + timedelta(seconds=math.ceil(delay))
        if loss.role == render.ROLE_COORDINATOR:
            # Recreate only the coordinator, after the backoff (a crash-looping one must not burn the budget in
            # seconds); the workers rejoin it and resume from the last committed checkpoint.
            self.st.backoff_until = fmt_time(until)
            self.st.phase = "Restarting"
            self.condition(
                cond.RESTARTING,
                cond.TRUE,
                cond.REASON_RESTART_BACKOFF,
                f"recreating the coordinator after {described}",
            )
            self.clear(cond.RUNNING, cond.REASON_RESTART_BACKOFF, "the coordinator failed")
            self.event(
                cond.NORMAL, cond.REASON_RESTART_BACKOFF, f"recreating the coordinator in {math.ceil(delay)}s"
            )
            self.summarize()
            self.requeue_in(FOLLOW_UP_SECONDS)
            return True
        # Restart the whole job: the current pods become an older generation (deleted next pass).
        self.st.restart_generation += 1
        self.st.restarts += 1
        self.st.backoff_until = fmt_time(until)
        self.st.pending_pods, self.st.known_pods = [], []
        self.st.phase = "Restarting"
        self.condition(
            cond.RESTARTING,
            cond.TRUE,
            cond.REASON_RESTART_BACKOFF,
            f"restart {self.st.restarts} after {described}",
        )
        self.clear(cond.RUNNING, cond.REASON_RESTART_BACKOFF, "restarting after a failure")
        self.event(
            cond.NORMAL,
            cond.REASON_RESTART_BACKOFF,
            f"restarting in {math.ceil(delay)}s (restart {self.st.restarts})",
        )
        self.st.workers = api.WorkersStatus(desired=self.spec.workers.desired, active=0, ready=0)
        self.requeue_in(FOLLOW_UP_SECONDS)
        return True

    # step: wait out the backoff, and for the old generation to leave the rendezvous
    def backoff_pending(self) -> bool:
        until = parse_time(self.st.backoff_until)
        if until is not None and self.now < until:
            self.requeue_in((until - self.now).total_seconds())
            self.summarize()
            return True
        old_workers = [p for p in self.old if pod_role(p) == render.ROLE_WORKER]
        if old_workers and not self.current:
            # The old generation may still be saving its checkpoint on SIGTERM: the new one must load that one.
            # (Its --rdzv-id differs, so the two never meet in a rendezvous round either way.)
            self.requeue_in(FOLLOW_UP_SECONDS)
            self.summarize()
            return True
        self.st.backoff_until = None
        return False

    # step: ask the coordinator for a checkpoint (termination notices, the user's annotation)
    def checkpoint_requests(self) -> None:
        coordinator_ready = any(pod_ready(p) for p in self.alive(render.ROLE_COORDINATOR))
        workers = self.alive(render.ROLE_WORKER)
        if not coordinator_ready or not workers:
            return  # nothing can save now; a notice is acted on again on the next pass
        noticed = set(self.st.noticed_pods)
        alive = self.alive(render.ROLE_WORKER) + self.alive(render.ROLE_COORDINATOR)
        fresh = [(pod_name(p), notice_of(p, self.nodes)) for p in alive if pod_name(p) not in noticed]
        fresh = [(n, why) for n, why in fresh if why]
        if fresh and self.spec.preemption.checkpoint_on_notice:
            names = ", ".join(n for n, _ in fresh)
            self.actions.append(RequestCheckpoint(f"termination notice: {fresh[0][1]}"))
            self.event(
                cond.NORMAL, cond.REASON_TERMINATION_NOTICE, f"{names}: {fresh[0][1]}; checkpoint requested"
            )
        self.st.noticed_pods += [n for n, _ in fresh]
        value = (self.meta.get("annotations") or {}).get(render.ANNOTATION_CHECKPOINT_REQUEST)
        if value and value != self.st.handled_checkpoint_request:
            self.st.handled_checkpoint_request = value
            self.actions.append(
                RequestCheckpoint(f"annotation {render.ANNOTATION_CHECKPOINT_REQUEST}={value}")
            )
            self.event(
                cond.NORMAL,
                cond.REASON_CHECKPOINT_REQUESTED,
                f"{render.ANNOTATION_CHECKPOINT_REQUEST}={value}",
            )

    # step: Secret, Service, coordinator, workers
    def next_index(self) -> int:
        pending = [int(n.rsplit("-", 1)[1]) for n in self.st.pending_pods]
        index = max([self.st.next_pod_index, self.max_index + 1] + [i + 1 for i in pending])
        self.st.next_pod_index = index + 1
        return index

    def is_worker_name(self, name: str) -> bool:
        return name.startswith(f"{self.ref.name}-worker-")

    def create(self, manifest: dict[str, Any]) -> None:
        self.actions.append(Create(manifest))
        if manifest["kind"] == "Pod":
            self.st.pending_pods.append(manifest["metadata"]["name"])

    def ensure_children(self) -> None:
        spec, ref, gen = self.spec, self.ref, self.st.restart_generation
        if not self.o.secret_exists:
            if not self.o.new_token:
                raise ValueError(
                    "Observed.new_token is empty: the handler must pass a fresh token for the Secret"
                )
            self.actions.append(Create(render.render_secret(ref, self.o.new_token)))
        if self.o.service is None:
            self.actions.append(Create(render.render_service(ref)))
        cluster_ip = ((self.o.service or {}).get("spec") or {}).get("clusterIP")
        if cluster_ip in (None, "", "None"):
            self.requeue_in(
                FOLLOW_UP_SECONDS
            )  # workers need the address; wait for the API server to assign it
            return
        # Re-issue creates that no list has shown yet (a 409 means they exist): never a second pod for one slot.
        for name in list(self.st.pending_pods):
            index = int(name.rsplit("-", 1)[1])
            if name == render.coordinator_name(ref.name, index):
                self.actions.append(
                    Create(render.render_coordinator_pod(ref, spec, index=index, generation=gen))
                )
            else:
                self.actions.append(
                    Create(
                        render.render_worker_pod(
                            ref, spec, index=index, generation=gen, coordinator_ip=cluster_ip
                        )
                    )
                )
        first = not self.prev.start_time
        pending_coord = [n for n in self.st.pending_pods if not self.is_worker_name(n)]
        coordinators = self.alive(render.ROLE_COORDINATOR)
        if not coordinators and not pending_coord:
            self.create(render.render_coordinator_pod(ref, spec, index=self.next_index(), generation=gen))
            if any(pod_role(p) == render.ROLE_WORKER for p in self.current):
                # Workers of this generation outlived their coordinator: this one replaces it.
                self.event(cond.NORMAL, cond.REASON_COORDINATOR_REPLACED, "created a new coordinator")
        retired = set(self.st.retired_pods)
        workers = [p for p in self.alive(render.ROLE_WORKER) if pod_name(p) not in retired]
        pending_workers = [n for n in self.st.pending_pods if self.is_worker_name(n)]
        have = len(workers) + len(pending_workers)
        desired = spec.workers.desired
        lost_now = [n for n in self.st.retired_pods if n not in self.prev.retired_pods]
        if have < desired:
            created = []
            for _ in range(desired - have):
                index = self.next_index()
                self.create(
                    render.render_worker_pod(
                        ref, spec, index=index, generation=gen, coordinator_ip=cluster_ip
                    )
                )
                created.append(render.worker_name(ref.name, index))
            if first:
                self.event(
                    cond.NORMAL, cond.REASON_CREATED, f"created coordinator and {len(created)} worker(s)"
                )
            elif lost_now:
                self.event(
                    cond.NORMAL,
                    cond.REASON_REPLACED,
                    f"replaced {', '.join(lost_now)} with {', '.join(created)}",
                )
            elif self.prev.phase == "Restarting" or self.prev.backoff_until:
                self.event(
                    cond.NORMAL, cond.REASON_RESTARTED, f"restart generation {gen}: {', '.join(created)}"
                )
            else:
                self.event(
                    cond.NORMAL, cond.REASON_SCALED_UP, f"{have} -> {desired} workers: {', '.join(created)}"
                )
        elif have > desired:
            # Scale down: newest first (the oldest have been in the rendezvous longest). Retire now, delete next pass.
            extra = sorted(workers, key=pod_index, reverse=True)[: have - desired]
            names = [pod_name(p) for p in extra]
            self.st.retired_pods += names
            if names:
                self.event(
                    cond.NORMAL,
                    cond.REASON_SCALED_DOWN,
                    f"{have} -> {desired} workers: removing {', '.join(names)}",
                )
                self.requeue_in(FOLLOW_UP_SECONDS)
        # Deferred deletes: only pods the persisted status already retired (counted or scaled away).
        for pod in self.current:
            if pod_name(pod) in self.prev.retired_pods:
                self.delete_pod(pod)
        if first:
            self.st.start_time = self.now_s
            self.condition(
                cond.CREATED, cond.TRUE, cond.REASON_CREATED, "coordinator, Service and workers created"
            )
        if lost_now or self.st.pending_pods:
            self.requeue_in(FOLLOW_UP_SECONDS)

    # step: counts, Running/Preempted conditions, phase, bookkeeping
    def summarize(self) -> None:
        if self.st.restart_generation != self.prev.restart_generation:
            # This pass retired the whole generation: nothing of it counts any more.
            self.st.workers = api.WorkersStatus(desired=self.st.workers.desired, active=0, ready=0)
            self.st.known_pods = []
            return
        retired = set(self.st.retired_pods)
        workers = [p for p in self.alive(render.ROLE_WORKER) if pod_name(p) not in retired]
        coordinators = self.alive(render.ROLE_COORDINATOR)
        ready = sum(map(pod_ready, workers))
        desired = self.spec.workers.desired if self.spec else self.st.workers.desired
        self.st.workers = api.WorkersStatus(desired=desired, active=len(workers), ready=ready)
        # Only pods still listed need remembering: a name never comes back.
        self.st.retired_pods = [
            n for n in self.st.retired_pods if n in self.by_name or n not in self.prev.retired_pods
        ]
        self.st.noticed_pods = [n for n in self.st.noticed_pods if n in self.by_name]
        self.st.known_pods = [pod_name(p) for p in workers + coordinators]
        if self.st.phase in api.FINISHED_PHASES or self.st.phase == "Restarting" and self.st.backoff_until:
            return
        coordinator_ready = any(pod_ready(p) for p in coordinators)
        if coordinator_ready and ready >= self.spec.workers.min:
            self.condition(
                cond.RUNNING, cond.TRUE, cond.REASON_TRAINING, f"{ready}/{desired} workers running"
            )
            self.st.phase = "Running"
            if cond.is_true(self.conds, cond.RESTARTING):
                self.condition(cond.RESTARTING, cond.FALSE, cond.REASON_RESTARTED, "running again")
            if cond.is_true(self.conds, cond.PREEMPTED) and ready >= desired:
                self.condition(
                    cond.PREEMPTED, cond.FALSE, cond.REASON_RECOVERED, f"back to {ready}/{desired} workers"
                )
        else:
            why = (
                cond.REASON_WAITING_FOR_COORDINATOR
                if not coordinator_ready
                else cond.REASON_WAITING_FOR_WORKERS
            )
            msg = f"{ready}/{desired} workers running (min {self.spec.workers.min})" + (
                "" if coordinator_ready else ", coordinator not ready"
            )
            if cond.find(self.conds, cond.RUNNING) is not None or self.st.start_time:
                self.condition(cond.RUNNING, cond.FALSE, why, msg)
            self.st.phase = (
                "Restarting"
                if cond.is_true(self.conds, cond.RESTARTING)
                else (
                    "Running"
                    if self.prev.phase == "Running" and cond.is_true(self.conds, cond.PREEMPTED)
                    else "Pending"
                )
            )
            self.requeue_in(POLL_SECONDS)


def plan(observed: Observed, now: datetime) -> Plan:
    """The actions that move the job toward its spec, and its new status. Same inputs, same plan.
    Raises InvalidStatus (and plans nothing) when the job's status cannot be read."""
    if now.tzinfo is None:
        raise ValueError("plan() needs an aware datetime (datetime.now(timezone.utc))")
    return _Planner(observed, now).run()


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
