"""Small builders for planner tests (JobSet's wrappers.go habit) and an in-memory store that applies plans.

`Store` is not a mock of the API: it keeps objects by name, refuses a second create of the same name (409), marks
graceful deletes with a deletionTimestamp, and persists only the status a handler would write.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from typing import Any

from ftjob_operator import conditions as cond
from ftjob_operator import planner, render

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
UID = "0d5f3c1e-0000-4000-8000-000000000001"


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "image": "ftjob-trainer:dev",
        "workers": {"min": 1, "max": 2},
        "checkpoint": {"volume": {"hostPath": {"path": "/tmp/ck"}}, "everySteps": 10},
        "failurePolicy": {"maxFailures": 2, "backoffBaseSeconds": 10, "backoffMaxSeconds": 60},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def job(
    name: str = "tj",
    *,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    generation: int = 1,
    **spec_overrides: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "ftjob.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "ns", "uid": UID, "generation": generation},
        "spec": spec(**spec_overrides),
    }
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    if status is not None:
        obj["status"] = status
    return obj


def pod(
    role: str,
    index: int,
    *,
    job_name: str = "tj",
    generation: int = 0,
    phase: str = "Running",
    ready: bool = True,
    node: str | None = "node-a",
    exit_code: int | None = None,
    term_reason: str | None = None,
    term_message: str | None = None,
    deleting: bool = False,
    disruption: str | None = None,
    status_reason: str | None = None,
    waiting: str | None = None,
    owner_uid: str | None = UID,
) -> dict[str, Any]:
    name = (
        render.worker_name(job_name, index) if role == "worker" else render.coordinator_name(job_name, index)
    )
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": render.pod_labels(job_name, role, generation, index),
    }
    if owner_uid is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "ftjob.dev/v1alpha1", "kind": "TrainingJob", "name": job_name, "uid": owner_uid}
        ]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T11:59:59Z"
        meta["deletionGracePeriodSeconds"] = 30
    conds = [{"type": "Ready", "status": "True" if ready and phase == "Running" else "False"}]
    if disruption:
        conds.append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
    state: dict[str, Any] = {"running": {}}
    if exit_code is not None:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": term_reason or ("Completed" if exit_code == 0 else "Error"),
            }
        }
        if term_message is not None:
            state["terminated"]["message"] = term_message
        phase = "Succeeded" if exit_code == 0 else "Failed"
    elif waiting:
        state = {"waiting": {"reason": waiting, "message": f"{waiting} for the image"}}
        phase = "Pending"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conds,
        "containerStatuses": [{"name": "c", "state": state}],
    }
    if status_reason:
        status["reason"] = status_reason
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node}, "status": status}


def node(name: str, *taint_keys: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"taints": [{"key": k, "value": "true", "effect": "NoSchedule"} for k in taint_keys]},
    }


def service(ip: str | None = "10.96.0.10") -> dict[str, Any]:
    return {"metadata": {"name": "tj-coordinator"}, "spec": {"clusterIP": ip}}


def running_observed(job_obj: dict[str, Any], workers: int = 2, **kw: Any) -> planner.Observed:
    pods = [pod("coordinator", 0)] + [pod("worker", i + 1) for i in range(workers)]
    return planner.Observed(
        job=job_obj,
        pods=kw.pop("pods", pods),
        nodes=kw.pop("nodes", [node("node-a")]),
        service=kw.pop("service", service()),
        secret_exists=kw.pop("secret_exists", True),
        new_token="t0ken",
        **kw,
    )


class Conflict(Exception):
    """A create of a name that exists (the API's 409 AlreadyExists)."""


class Store:
    """The objects a handler would see, and what applying a plan does to them."""

    def __init__(self, job_obj: dict[str, Any], nodes: list[dict[str, Any]] | None = None):
        self.job = copy.deepcopy(job_obj)
        self.pods: dict[str, dict[str, Any]] = {}
        self.nodes = nodes if nodes is not None else [node("node-a"), node("node-b")]
        self.service: dict[str, Any] | None = None
        self.secret = False
        self.progress: dict[str, Any] | None = None
        self.checkpoint_requests: list[str] = []
        self.events: list[planner.Event] = []
        self.job_deleted = False
        self.creates = 0
        self.schedule_to = "node-a"  # the node new pods land on

    def observe(self) -> planner.Observed:
        return planner.Observed(
            job=copy.deepcopy(self.job),
            pods=[copy.deepcopy(p) for p in self.pods.values()],
            nodes=copy.deepcopy(self.nodes),
            service=copy.deepcopy(self.service),
            secret_exists=self.secret,
            progress=copy.deepcopy(self.progress),
            new_token="t0ken",
        )

    def apply(self, plan: planner.Plan, *, write_status: bool = True, apply_actions: bool = True) -> None:
        if write_status:
            self.job["status"] = copy.deepcopy(plan.status)
        if not apply_actions:
            return
        for action in plan.actions:
            if isinstance(action, planner.Create):
                self.create(action.manifest)
            elif isinstance(action, planner.Delete):
                if action.kind == "TrainingJob":
                    self.job_deleted = True
                elif action.name in self.pods:
                    p = self.pods[action.name]
                    if action.grace_period_seconds == 0:
                        del self.pods[action.name]
                    else:
                        p["metadata"].setdefault("deletionTimestamp", "2026-01-01T12:00:00Z")
            elif isinstance(action, planner.RequestCheckpoint):
                self.checkpoint_requests.append(action.reason)
            elif isinstance(action, planner.Event):
                self.events.append(action)

    def create(self, manifest: dict[str, Any]) -> None:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if kind == "Secret":
            self.secret = True
        elif kind == "Service":
            self.service = {
                "metadata": manifest["metadata"],
                "spec": {**manifest["spec"], "clusterIP": "10.96.0.10"},
            }
        elif kind == "Pod":
            if name in self.pods:
                return  # 409: the handler treats AlreadyExists as done
            self.creates += 1
            p = copy.deepcopy(manifest)
            p["spec"]["nodeName"] = self.schedule_to
            p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            self.pods[name] = p

    # --- what happens to pods out there -----------------------------------------------------------------------
    def finish_terminating(self) -> None:
        """The kubelet finishes every graceful delete."""
        for name in [n for n, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[name]

    def exit(self, name: str, code: int, reason: str = "Error", message: str | None = None) -> None:
        p = self.pods[name]
        term: dict[str, Any] = {"exitCode": code, "reason": reason}
        if message is not None:
            term["message"] = message
        p["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "c", "state": {"terminated": term}}],
        }

    def preempt(self, name: str) -> None:
        """DisruptionTarget + graceful deletion, as the local cluster does."""
        p = self.pods[name]
        p["status"]["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
        )
        p["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"

    def names(self, role: str) -> list[str]:
        return sorted(
            (
                n
                for n, p in self.pods.items()
                if planner.pod_role(p) == role and not p["metadata"].get("deletionTimestamp")
            ),
            key=lambda n: int(n.rsplit("-", 1)[1]),
        )

    @property
    def status(self) -> dict[str, Any]:
        return self.job.get("status") or {}


def converge(store: Store, now: datetime, passes: int = 6) -> planner.Plan:
    """Plan and apply until a pass changes nothing (or `passes` runs out)."""
    last = None
    for _ in range(passes):
        last = planner.plan(store.observe(), now)
        before = (copy.deepcopy(store.job.get("status")), sorted(store.pods))
        store.apply(last)
        if not [a for a in last.actions if not isinstance(a, planner.Event)] and before == (
            store.job.get("status"),
            sorted(store.pods),
        ):
            break
    assert last is not None
    return last


# --- reading a plan --------------------------------------------------------------------------------------------
def pods_created(p: planner.Plan) -> list[str]:
    return [a.name for a in p.of(planner.Create) if a.kind == "Pod"]


def reasons(p: planner.Plan) -> list[str]:
    return [e.reason for e in p.of(planner.Event)]


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    c = cond.find(status.get("conditions", []), type_)
    assert c is not None, f"no {type_} condition in {status.get('conditions')}"
    return c


def started(expect: int = 2, **spec_overrides: Any) -> Store:
    """A job whose coordinator and workers are running (planned from scratch, not hand-written)."""
    store = Store(job(**spec_overrides))
    converge(store, NOW)
    assert len(store.names("worker")) == expect, store.pods.keys()
    return store


def healthy_status() -> dict[str, Any]:
    """The persisted status of a running job with tj-coordinator-0, tj-worker-1 and tj-worker-2."""
    return {
        "operator": {"knownPods": ["tj-coordinator-0", "tj-worker-1", "tj-worker-2"], "nextPodIndex": 3},
        "startTime": "x",
    }


def with_book(status: dict[str, Any], **bookkeeping: Any) -> dict[str, Any]:
    """A copy of `status` with these status.operator fields (camelCase) set."""
    return {**status, "operator": {**(status.get("operator") or {}), **bookkeeping}}
