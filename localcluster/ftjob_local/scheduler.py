"""The local scheduler: binds pending pods to ready nodes.

Filters as kube-scheduler's default plugins do for what ftjob uses: node Ready and schedulable (a cordoned node
only for a pod that tolerates node.kubernetes.io/unschedulable), nodeSelector and required node affinity
(matchExpressions and matchFields), NoSchedule/NoExecute taints against tolerations, requested
cpu/memory/nvidia.com/gpu and the pod count against allocatable, then the rules between pods (placement.py:
required pod (anti-)affinity, topology spread constraints with DoNotSchedule). Among the nodes that fit it picks
the best by placement.inter_pod_penalty (preferred (anti-)affinity, ScheduleAnyway spreads), then fewer untolerated
PreferNoSchedule taints, then the fewest pods (spreading, like the default least-allocated score). A pod that fits
nowhere stays Pending with PodScheduled=False (Unschedulable) and a FailedScheduling event; it is retried on the
events that can make it fit, as kube-scheduler's unschedulable queue does (Scheduler). `choose_node` is the whole
decision, pure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

from .client import ApiError, Informer, Kube, Obj
from .objects import (
    RESOURCES,
    condition,
    is_terminal,
    meta,
    pod_path,
    pod_requests,
    post_event,
    set_condition,
)
from .placement import Placed, inter_pod_filter, inter_pod_penalty, node_fits_affinity

log = logging.getLogger(__name__)
SCHEDULER_NAME = "default-scheduler"
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
FLUSH_SECONDS = 60.0  # the longest a pod that fit nowhere waits for its next try (kube-scheduler: 5 min)


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if not t.get("key"):  # empty key with Exists tolerates everything
            if t.get("operator") == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def is_ready(node: Obj) -> bool:
    c = condition(node, "Ready")
    return bool(c and c.get("status") == "True")


def filter_node(pod: Obj, node: Obj, used: dict[str, Decimal], pods_on_node: int) -> str | None:
    """None when pod fits node, else the reason in kube-scheduler's words."""
    spec = pod.get("spec") or {}
    labels = meta(node).get("labels") or {}
    if not is_ready(node):
        return "node(s) were not ready"
    if (node.get("spec") or {}).get("unschedulable") and not tolerates(
        spec.get("tolerations"), UNSCHEDULABLE_TAINT
    ):
        return "node(s) were unschedulable"
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return "node(s) didn't match Pod's node affinity/selector"
    if not node_fits_affinity(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
            spec.get("tolerations"), taint
        ):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    allocatable = (
        (node.get("status") or {}).get("allocatable") or (node.get("status") or {}).get("capacity") or {}
    )
    if pods_on_node + 1 > int(parse_quantity(allocatable.get("pods", "110"))):
        return "Too many pods"
    asked = pod_requests(pod)
    for r in RESOURCES:
        if asked[r] and used.get(r, Decimal(0)) + asked[r] > parse_quantity(allocatable.get(r, "0")):
            return f"Insufficient {r}"
    return None


def _soft_taints(pod: Obj, node: Obj) -> int:
    """PreferNoSchedule taints the pod does not tolerate (kube-scheduler's TaintToleration score)."""
    taints = (node.get("spec") or {}).get("taints") or []
    tolerations = (pod.get("spec") or {}).get("tolerations")
    return sum(t.get("effect") == "PreferNoSchedule" and not tolerates(tolerations, t) for t in taints)


def choose_node(
    pod: Obj, placed: Placed, used: dict[str, dict[str, Decimal]]
) -> tuple[str | None, Counter[str]]:
    """The node for `pod`, or None and how many nodes refused it for each reason."""
    reasons: Counter[str] = Counter()
    fits = []
    for name, node in placed.nodes.items():
        on_node = len(placed.on.get(name, []))
        why = filter_node(pod, node, used.get(name, {}), on_node) or inter_pod_filter(pod, node, placed)
        if why:
            reasons[why] += 1
        else:
            fits.append(name)
    if not fits:
        return None, reasons

    def rank(name: str) -> tuple[int, int, int, str]:
        node = placed.nodes[name]
        return (
            inter_pod_penalty(pod, node, placed),
            _soft_taints(pod, node),
            len(placed.on.get(name, [])),
            name,
        )

    return min(fits, key=rank), reasons


def _relevant(node: Obj) -> tuple:
    """What of a node the filters read: a change here can make a waiting pod fit (a heartbeat changes none)."""
    status = node.get("status") or {}
    return (
        meta(node).get("labels"),
        node.get("spec"),
        status.get("allocatable") or status.get("capacity"),
        is_ready(node),
    )


def _wants_neighbours(pod: Obj) -> bool:
    """Whether placing a pod can make this one fit: required pod affinity, or a DoNotSchedule spread constraint
    (a pod placed in the emptiest domain lowers the skew elsewhere)."""
    spec = pod.get("spec") or {}
    return bool(
        ((spec.get("affinity") or {}).get("podAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or any(
            c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
            for c in spec.get("topologySpreadConstraints") or []
        )
    )


class Scheduler:
    """kube-scheduler's queues: a pod that comes (or changes) is tried at once; one that fits nowhere waits in the
    unschedulable set until an event that can make it fit: a node added or changed in what the filters read, a
    placed pod gone, finished or moved, or (for required pod affinity or topology spread) a pod placed; and at the
    latest FLUSH_SECONDS after its last try. The placed pods and each node's requests are kept from the events, so an event costs the
    pod or node it names, not a pass over every pod (issue 15)."""

    def __init__(self, kube: Kube, pods: Informer, nodes: Informer):
        self.kube, self.pods, self.nodes = kube, pods, nodes
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._assumed: dict[str, str] = {}  # pod uid -> node, until the cache shows the binding
        self._reported: dict[str, str] = {}  # pod uid -> last FailedScheduling message
        self._binding_supported = True
        self._events: deque[tuple[str, str, Obj]] = deque()
        self._nodes: dict[str, Obj] = {}
        self.placed = Placed(self._nodes)
        self._used: dict[str, dict[str, Decimal]] = {}  # node -> requests of the pods placed there
        self._active: dict[str, Obj] = {}  # uid -> pod to try on the next pass
        self._unschedulable: dict[str, Obj] = {}  # uid -> the pod as it was when no node fit, oldest first
        self._since: dict[str, float] = {}  # uid -> when it last fit nowhere
        self._wants_neighbours: set[str] = set()  # unschedulable pods that a pod placed may let in
        self.attempts = 0  # pods tried against the nodes: what the tests bound
        pods.listeners.append(lambda kind, obj: self._event("pod", kind, obj))
        nodes.listeners.append(lambda kind, obj: self._event("node", kind, obj))
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()

    def _event(self, resource: str, kind: str, obj: Obj) -> None:
        self._events.append((resource, kind, obj))
        self.wake.set()

    def _run(self) -> None:
        self.pods.synced.wait()
        self.nodes.synced.wait()
        # What the caches held before this scheduler listened (replaying an object it has seen changes nothing).
        for resource, informer in (("node", self.nodes), ("pod", self.pods)):
            for obj in informer.items():
                self._event(resource, "MODIFIED", obj)
        while not self._stop.is_set():
            oldest = next(iter(self._unschedulable), None)  # the first to be due for its periodic try
            waited = time.monotonic() - self._since[oldest] if oldest is not None else 0.0
            self.wake.wait(max(0.1, FLUSH_SECONDS - waited))
            self.wake.clear()
            try:
                self.schedule_once()
            except Exception:
                log.exception("scheduling pass failed")
                self._stop.wait(0.5)
                self.wake.set()  # the pods of the failed pass are still active

    # --- what the events say --------------------------------------------------------------------------------------
    def _retry_all(self) -> None:
        self._active.update(self._unschedulable)
        self._unschedulable.clear()
        self._since.clear()

    def _unwait(self, uid: str) -> Obj | None:
        self._since.pop(uid, None)
        return self._unschedulable.pop(uid, None)

    def _on_node(self, kind: str, node: Obj) -> None:
        name = meta(node)["name"]
        if kind == "DELETED":
            self._nodes.pop(name, None)
            self._used.pop(name, None)
            return
        before = self._nodes.get(name)
        self._nodes[name] = node
        if name not in self._used:
            self._used[name] = {r: Decimal(0) for r in RESOURCES}
            for pod in self.placed.on.get(name, {}).values():
                self._charge(name, pod, 1)
        if before is None or _relevant(before) != _relevant(node):
            self._retry_all()

    def _charge(self, node: str, pod: Obj, sign: int) -> None:
        if node in self._used:
            for r, q in pod_requests(pod).items():
                self._used[node][r] += sign * q

    def _unplace(self, uid: str) -> None:
        node = self.placed.node_of(uid)
        if node is not None:
            self._charge(node, self.placed.on[node][uid], -1)
            self.placed.remove(uid)
            self._retry_all()  # freed requests, or an anti-affinity peer gone

    def _place(self, pod: Obj, node: str) -> None:
        uid = meta(pod).get("uid", "")
        before = self.placed.node_of(uid)
        old = self.placed.on[before][uid] if before is not None else None
        if before is not None:
            self._charge(before, old, -1)
        self.placed.add(pod, node)
        self._charge(node, pod, 1)
        if old is not None and (before != node or meta(old).get("labels") != meta(pod).get("labels")):
            self._retry_all()
        elif old is None:  # a new neighbour can satisfy a waiting pod's pod affinity or topology spread
            for u in self._wants_neighbours & self._unschedulable.keys():
                self._active[u] = self._unwait(u)
            self._wants_neighbours.clear()

    def _on_pod(self, kind: str, pod: Obj) -> None:
        m, spec = meta(pod), pod.get("spec") or {}
        uid = m.get("uid", "")
        if kind == "DELETED" or is_terminal(pod):
            self._unplace(uid)
            self._unwait(uid)
            for table in (self._active, self._assumed, self._reported):
                table.pop(uid, None)
            return
        if spec.get("nodeName"):
            self._assumed.pop(uid, None)
            self._active.pop(uid, None)
            self._unwait(uid)
            self._place(pod, spec["nodeName"])
            return
        if uid in self._assumed or spec.get("schedulerName", SCHEDULER_NAME) != SCHEDULER_NAME:
            return  # bound by this scheduler (the cache is behind), or not ours
        if m.get("deletionTimestamp"):
            self._active.pop(uid, None)
            self._unwait(uid)
            return
        waiting = self._unschedulable.get(uid)
        if (
            waiting is not None
            and waiting.get("spec") == spec
            and meta(waiting).get("labels") == m.get("labels")
        ):
            self._unschedulable[uid] = pod  # its status only (this scheduler's own Unschedulable condition)
            return
        self._unwait(uid)
        self._active[uid] = pod

    # --- one pass -------------------------------------------------------------------------------------------------
    def schedule_once(self) -> None:
        while self._events:
            resource, kind, obj = self._events.popleft()
            (self._on_pod if resource == "pod" else self._on_node)(kind, obj)
        now = time.monotonic()
        for uid in list(
            self._unschedulable
        ):  # oldest first: stops at the first that has not waited long enough
            if now - self._since[uid] < FLUSH_SECONDS:
                break
            self._active[uid] = self._unwait(uid)
        order = sorted(
            self._active.values(), key=lambda p: (meta(p).get("creationTimestamp") or "", meta(p).get("name"))
        )
        for pod in order:
            uid = meta(pod).get("uid", "")
            if self._active.get(uid) is not pod:
                continue
            self.attempts += 1
            target, reasons = choose_node(pod, self.placed, self._used)
            try:
                if target is None:
                    self._unschedulable[uid] = self._active.pop(uid)
                    self._since[uid] = time.monotonic()
                    if _wants_neighbours(pod):
                        self._wants_neighbours.add(uid)
                    self._unschedulable_report(pod, len(self._nodes), reasons)
                elif self._bind(pod, target):  # the next pending pod sees this one where it went
                    self._active.pop(uid, None)
                    self._place(pod, target)
                else:  # deleted meanwhile, or already bound: its event says which
                    self._active.pop(uid, None)
            except Exception:
                self._active[uid] = pod  # tried again on the next pass
                self._unwait(uid)
                raise
        if self._active:  # pods a placement of this pass made worth another try
            self.wake.set()

    def _bind(self, pod: Obj, node: str) -> bool:
        m = meta(pod)
        ns, name, uid = m.get("namespace", "default"), m["name"], m.get("uid")
        try:
            if self._binding_supported:
                try:
                    self.kube.request(
                        "POST",
                        pod_path(ns, name, "binding"),
                        body={
                            "apiVersion": "v1",
                            "kind": "Binding",
                            "metadata": {"name": name, "namespace": ns, "uid": uid},
                            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                        },
                    )
                except ApiError as e:
                    if e.status not in (404, 405) or self.kube.get(pod_path(ns, name)) is None:
                        raise
                    log.warning("API server has no pods/binding (%s); binding by patching spec.nodeName", e)
                    self._binding_supported = False
            if not self._binding_supported:
                self.kube.merge_patch(
                    pod_path(ns, name), {"metadata": {"uid": uid}, "spec": {"nodeName": node}}
                )
        except ApiError as e:
            if e.status in (404, 409):  # deleted meanwhile, or already bound
                return False
            raise
        self._assumed[uid] = node
        self._reported.pop(uid, None)
        post_event(
            self.kube,
            pod,
            "Scheduled",
            f"Successfully assigned {ns}/{name} to {node}",
            component=SCHEDULER_NAME,
        )
        return True

    def _unschedulable_report(self, pod: Obj, total: int, reasons: Counter[str]) -> None:
        detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        message = f"0/{total} nodes are available" + (f": {detail}." if detail else ": no nodes registered.")
        uid = meta(pod).get("uid", "")
        if self._reported.get(uid) == message:
            return
        conds = set_condition(
            (pod.get("status") or {}).get("conditions") or [],
            "PodScheduled",
            "False",
            "Unschedulable",
            message,
        )
        m = meta(pod)
        try:
            self.kube.merge_patch(
                pod_path(m.get("namespace", "default"), m["name"], "status"),
                {"status": {"phase": "Pending", "conditions": conds}},
            )
        except ApiError as e:
            if e.status != 404:
                raise
            return
        self._reported[uid] = message
        post_event(self.kube, pod, "FailedScheduling", message, type_="Warning", component=SCHEDULER_NAME)
