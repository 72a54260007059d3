"""The observed world: what the handler saw (`Observed`), the nodes, and how to read a pod.

Everything here reads Kubernetes JSON (camelCase dicts) and decides nothing about the job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .. import render
from ..network_policy import OperatorPods

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
MAX_MESSAGE = 512  # characters of a pod's or the trainer's message the status keeps


@dataclass(frozen=True)
class Observed:
    """What the handler saw, as Kubernetes JSON (camelCase dicts)."""

    # the TrainingJob: metadata (uid, generation, annotations, deletionTimestamp), spec, status
    job: dict[str, Any]
    # pods labelled ftjob.dev/job-name=<job>, any generation
    pods: list[dict[str, Any]] = field(default_factory=list)
    # every node; None when unknown (then "node gone" is never concluded)
    nodes: list[dict[str, Any]] | None = None
    service: dict[str, Any] | None = None  # the coordinator Service, if it exists
    secret_exists: bool = False
    progress: dict[str, Any] | None = None  # GET /v1/progress from the coordinator, when it answered
    # the token for the Secret, used only when it has to be created (tokens.py: derived, or a fresh random one)
    new_token: str = ""
    # The job's NetworkPolicy (network_policy.py): whether the operator makes one (`--network-policy`), whether it
    # exists, and the operator's pods it admits to the control API (None: an operator outside the cluster).
    network_policy: bool = False
    network_policy_exists: bool = False
    operator_pods: OperatorPods | None = None
    # The operator's default trainer image (env FTJOB_DEFAULT_TRAINER_IMAGE, set by the chart), for jobs without
    # spec.image; "" when the operator has none.
    default_image: str = ""
    # termination taint keys the operator was given beyond the built-in ones (env FTJOB_EXTRA_TERMINATION_TAINTS)
    extra_termination_taints: frozenset[str] = frozenset()


class Nodes:
    """Node existence and taints; knows nothing when the handler did not list nodes."""

    def __init__(
        self, nodes: list[dict[str, Any]] | None, extra_termination_taints: frozenset[str] = frozenset()
    ):
        # An empty list is an index not synced yet (a cluster running our pods has nodes): concluding "every
        # node gone" from it would retire every pod.
        self.known = bool(nodes)
        self.by_name = {n["metadata"]["name"]: n for n in nodes or []}
        # taint keys that announce a termination beyond preemption.TERMINATION_TAINTS (the chart's list)
        self.extra_termination_taints = extra_termination_taints

    def gone(self, name: str | None) -> bool:
        return bool(name) and self.known and name not in self.by_name

    def taint_keys(self, name: str | None) -> list[str]:
        node = self.by_name.get(name or "")
        return [t.get("key") for t in ((node or {}).get("spec") or {}).get("taints") or []]

    def cordoned(self, name: str) -> bool:
        """spec.unschedulable: `kubectl cordon`, and the first step of `kubectl drain`."""
        return bool((self.by_name.get(name) or {}).get("spec", {}).get("unschedulable"))

    def not_ready(self, name: str | None) -> bool:
        """The node is known and its Ready condition is False or Unknown (a kubelet that stopped reporting)."""
        node = self.by_name.get(name or "")
        ready = next(
            (
                c
                for c in ((node or {}).get("status") or {}).get("conditions") or []
                if c.get("type") == "Ready"
            ),
            None,
        )
        return ready is not None and ready.get("status") != "True"


# --- reading a pod ---------------------------------------------------------------------------------------------
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


def pod_node(pod: dict[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def pod_deleting(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_conditions(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return (pod.get("status") or {}).get("conditions") or []


def pod_condition(pod: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The first condition of this type, or None."""
    return next((c for c in pod_conditions(pod) if c.get("type") == type_), None)


def _container_state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return (statuses[0] if statuses else {}).get("state") or {}


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The main container's `state.terminated` (exitCode, reason, message), if it ended."""
    return _container_state(pod).get("terminated")


def waiting(pod: dict[str, Any]) -> dict[str, Any]:
    """The main container's `state.waiting` (reason, message), or {}."""
    return _container_state(pod).get("waiting") or {}


def fatal_waiting_reason(pod: dict[str, Any]) -> str | None:
    reason = waiting(pod).get("reason")
    return reason if reason in FATAL_WAITING_REASONS else None


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
    if (pod.get("status") or {}).get("phase") != "Running":
        return False
    ready = pod_condition(pod, "Ready")
    return ready is None or ready.get("status") == "True"


def loss_of(pod: dict[str, Any], nodes: Nodes) -> str | None:
    """Why this pod no longer counts as a live member (it may still be terminating), or None if it is alive."""
    if pod_succeeded(pod):
        return None
    if pod_deleting(pod):
        return "deleted"
    if (pod.get("status") or {}).get("phase") == "Failed":
        return "failed"
    if nodes.gone(pod_node(pod)):
        return "node gone"
    return fatal_waiting_reason(pod)
