"""The local scheduler: binds pending pods to ready nodes.

Filters as kube-scheduler's default plugins do for what ftjob uses: node Ready and schedulable (a cordoned node
only for a pod that tolerates node.kubernetes.io/unschedulable), nodeSelector and required node affinity
(matchExpressions and matchFields), NoSchedule/NoExecute taints against tolerations, requested
cpu/memory/nvidia.com/gpu and the pod count against allocatable, then the rules between pods (placement.py:
required pod (anti-)affinity, topology spread constraints with DoNotSchedule). Among the nodes that fit it picks
the best by placement.inter_pod_penalty (preferred (anti-)affinity, ScheduleAnyway spreads), then fewer untolerated
PreferNoSchedule taints, then the fewest pods (spreading, like the default least-allocated score). A pod that fits
nowhere stays Pending with PodScheduled=False (Unschedulable) and a FailedScheduling event; it is retried whenever
pods or nodes change. `choose_node` is the whole decision, pure.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
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


class Scheduler:
    def __init__(self, kube: Kube, pods: Informer, nodes: Informer):
        self.kube, self.pods, self.nodes = kube, pods, nodes
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._assumed: dict[str, str] = {}  # pod uid -> node, until the cache shows the binding
        self._reported: dict[str, str] = {}  # pod uid -> last FailedScheduling message
        self._binding_supported = True
        pods.listeners.append(lambda *_: self.wake.set())
        nodes.listeners.append(lambda *_: self.wake.set())
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()

    def _run(self) -> None:
        self.pods.synced.wait()
        self.nodes.synced.wait()
        while not self._stop.is_set():
            self.wake.wait(2.0)  # also retries unschedulable pods every 2 s
            self.wake.clear()
            try:
                self.schedule_once()
            except Exception:
                log.exception("scheduling pass failed")
                self._stop.wait(0.5)

    def schedule_once(self) -> None:
        pods = self.pods.items()
        nodes = {meta(n)["name"]: n for n in self.nodes.items()}
        used: dict[str, dict[str, Decimal]] = {n: {r: Decimal(0) for r in RESOURCES} for n in nodes}
        placed = Placed(nodes)
        pending = []
        for pod in pods:
            uid = meta(pod).get("uid", "")
            node = (pod.get("spec") or {}).get("nodeName") or self._assumed.get(uid)
            if (pod.get("spec") or {}).get("nodeName"):
                self._assumed.pop(uid, None)
            if node:
                if node in used and not is_terminal(pod):
                    placed.add(pod, node)
                    for r, q in pod_requests(pod).items():
                        used[node][r] += q
            elif (
                not meta(pod).get("deletionTimestamp")
                and not is_terminal(pod)
                and (pod.get("spec") or {}).get("schedulerName", SCHEDULER_NAME) == SCHEDULER_NAME
            ):
                pending.append(pod)
        live = {meta(p).get("uid") for p in pods}
        self._assumed = {u: n for u, n in self._assumed.items() if u in live}
        self._reported = {u: m for u, m in self._reported.items() if u in live}
        pending.sort(key=lambda p: (meta(p).get("creationTimestamp") or "", meta(p).get("name")))
        for pod in pending:
            target, reasons = choose_node(pod, placed, used)
            if target is None:
                self._unschedulable(pod, len(nodes), reasons)
                continue
            if self._bind(pod, target):  # the next pending pod sees this one where it went
                placed.add(pod, target)
                for r, q in pod_requests(pod).items():
                    used[target][r] += q

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

    def _unschedulable(self, pod: Obj, total: int, reasons: Counter[str]) -> None:
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
