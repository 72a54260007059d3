"""Simulated spot interruptions.

`ftjob local preempt` (request_preemption) taints the node at once and writes the request as JSON into the node's
annotation `ftjob.dev/preempt-request`; the node agent that serves the node carries it out (Preemption), because
the sequence outlives the command: after the notice, DisruptionTarget (reason TerminationByKubelet) on the node's
pods and graceful deletion (SIGTERM, the pod's grace period, SIGKILL), then the node object is deleted. `--hard`
kills the pods' processes at once, deletes the pods with grace 0 and the node right away. `--replace-after S`
registers a fresh node of the same kind (a new name) S seconds after the request, as an autoscaler would.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Protocol

from ftjob_trainer.contract import CONDITION_DISRUPTION_TARGET, TAINT_SPOT_INTERRUPTION, now_rfc3339

from .client import ApiError, Kube, Obj, wait_for
from .objects import (
    PREEMPT_ANNOTATION,
    SPOT_LABEL,
    is_terminal,
    meta,
    node_path,
    pod_path,
    post_event,
    set_condition,
)

log = logging.getLogger(__name__)

DISRUPTION_REASON = "TerminationByKubelet"


class NodeHost(Protocol):
    """What a Preemption needs of the node agent that serves the node (ftjob_local.node.agent.NodeAgent)."""

    kube: Kube

    def pods_on(self, node: str) -> list[Obj]:
        """The pods bound to node, from the agent's cache."""
        ...

    def add_node(self, kind: str) -> str:
        """Registers and serves a fresh node of kind "node" or "spot"; returns its name."""
        ...

    def stop_serving(self, name: str) -> None:
        """Stops running pods on the node: its pod processes are SIGKILLed."""
        ...

    def set_pod_condition(self, uid: str, ctype: str, status: str, reason: str, message: str) -> bool:
        """Sets a condition through the pod's running worker; False when no worker of this agent runs the pod."""
        ...


def spot_taint() -> Obj:
    return {
        "key": TAINT_SPOT_INTERRUPTION,
        "value": "true",
        "effect": "NoSchedule",
        "timeAdded": now_rfc3339(),
    }


def request_preemption(
    kube: Kube, node: str, *, notice: float = 0.0, hard: bool = False, replace_after: float | None = None
) -> Obj:
    """Taints the node (unless hard) and leaves the request for its node agent; returns the request."""
    if notice < 0 or (replace_after is not None and replace_after < 0):
        raise ValueError("--notice and --replace-after take seconds >= 0")
    current = kube.get(node_path(node))
    if current is None:
        names = sorted(meta(n)["name"] for n in kube.request("GET", "/api/v1/nodes").get("items") or [])
        raise LookupError(f"node {node!r} not found; nodes: {', '.join(names) or 'none'}")
    req = {
        "id": uuid.uuid4().hex[:12],
        "notice": notice,
        "hard": hard,
        "replaceAfter": replace_after,
        "requestedAt": time.time(),
    }
    patch: Obj = {"metadata": {"annotations": {PREEMPT_ANNOTATION: json.dumps(req)}}}
    taints = (current.get("spec") or {}).get("taints") or []
    if not hard and not any(t.get("key") == TAINT_SPOT_INTERRUPTION for t in taints):
        patch["spec"] = {"taints": taints + [spot_taint()]}
    kube.merge_patch(node_path(node), patch)
    return req


class Preemption:
    """Carries out one request on the node agent's side, in its own thread."""

    def __init__(self, host: NodeHost, node: Obj, req: Obj):
        self.host, self.kube = host, host.kube
        self.node_name = meta(node)["name"]
        self.node = node
        self.req = req
        self.start_wall = float(req.get("requestedAt") or time.time())
        self.thread = threading.Thread(target=self._run, name=f"preempt-{self.node_name}", daemon=True)

    def start(self) -> Preemption:
        self.thread.start()
        return self

    def _pods(self) -> list[Obj]:
        return self.host.pods_on(self.node_name)

    def _run(self) -> None:
        try:
            kind = "spot" if (meta(self.node).get("labels") or {}).get(SPOT_LABEL) == "true" else "node"
            if self.req.get("replaceAfter") is not None:
                delay = max(0.0, self.start_wall + float(self.req["replaceAfter"]) - time.time())
                timer = threading.Timer(delay, self.host.add_node, args=(kind,))
                timer.daemon = True
                timer.start()
            if self.req.get("hard"):
                self._hard()
            else:
                self._with_notice()
        except Exception:
            log.exception("preemption of %s failed", self.node_name)

    def _hard(self) -> None:
        post_event(
            self.kube,
            {**self.node, "kind": "Node"},
            "NodeTerminated",
            "Simulated hard interruption: the node is gone without notice",
            type_="Warning",
            component="ftjob-local-preempt",
            host=self.node_name,
        )
        self.host.stop_serving(self.node_name)  # the kubelet SIGKILLs this node's pods now
        for pod in self._pods():
            m = meta(pod)
            self.kube.delete(pod_path(m.get("namespace", "default"), m["name"]), grace=0, uid=m.get("uid"))
        self.kube.delete(node_path(self.node_name))

    def _with_notice(self) -> None:
        notice = float(self.req.get("notice") or 0)
        post_event(
            self.kube,
            {**self.node, "kind": "Node"},
            "SpotInterruption",
            f"Simulated spot interruption notice: the node goes away in {notice:g}s",
            type_="Warning",
            component="ftjob-local-preempt",
            host=self.node_name,
        )
        time.sleep(max(0.0, self.start_wall + notice - time.time()))
        message = f"Node {self.node_name} is being preempted (simulated spot interruption)"
        longest = 0
        for pod in self._pods():
            m = meta(pod)
            ns, name, uid = m.get("namespace", "default"), m["name"], m.get("uid")
            if is_terminal(pod):
                self.kube.delete(pod_path(ns, name), grace=0, uid=uid)
                continue
            if not self.host.set_pod_condition(
                uid, CONDITION_DISRUPTION_TARGET, "True", DISRUPTION_REASON, message
            ):
                conds = set_condition(
                    (pod.get("status") or {}).get("conditions") or [],
                    CONDITION_DISRUPTION_TARGET,
                    "True",
                    DISRUPTION_REASON,
                    message,
                )
                try:
                    self.kube.merge_patch(pod_path(ns, name, "status"), {"status": {"conditions": conds}})
                except ApiError as e:
                    log.warning("DisruptionTarget on %s/%s: %s", ns, name, e)
            grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            longest = max(longest, grace)
            self.kube.delete(pod_path(ns, name), grace=grace, uid=uid)
        try:
            wait_for(
                lambda: not self._pods(), timeout=longest + 15, what=f"the pods of {self.node_name} to end"
            )
        except TimeoutError as e:
            log.warning("%s; deleting the node anyway", e)
        self.host.stop_serving(self.node_name)
        self.kube.delete(node_path(self.node_name))


def request_of(node: Obj) -> Obj | None:
    raw = (meta(node).get("annotations") or {}).get(PREEMPT_ANNOTATION)
    if not raw:
        return None
    try:
        req = json.loads(raw)
    except ValueError:
        log.warning("node %s: unreadable %s annotation %r", meta(node).get("name"), PREEMPT_ANNOTATION, raw)
        return None
    return req if isinstance(req, dict) and req.get("id") else None
