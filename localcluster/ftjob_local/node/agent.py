"""The node agent process: node registration and heartbeats, plus the scheduler and the kubelet.

The top of the node side: it imports the kubelet, scheduler and preemption; none of them import it (Preemption
sees it through preempt.NodeHost). The service proxy runs in a process of its own (netproxy), as kube-proxy does:
a restart of this agent must not cut the connections pods hold through Service addresses.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

from ftjob_trainer.contract import format_time_micro, now_rfc3339

from .. import scheduler as scheduler_mod
from ..client import ApiError, Informer, Kube, Obj
from ..kubelet import HOST_IP, Kubelet
from ..objects import SPOT_LABEL, meta, node_path, set_condition
from ..preempt import Preemption, request_of

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
LEASE_NAMESPACE = "kube-node-lease"
KUBELET_VERSION = "v1.32.0-ftjob-local"


def total_memory() -> str:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return f"{pages * size // (1024 * 1024)}Mi"
    except (ValueError, OSError):
        return "8Gi"


class NodeAgent:
    def __init__(
        self,
        kubeconfig: str,
        state_dir: Path,
        nodes: int = 1,
        spot_nodes: int = 2,
        gpus: int = 0,
        cpu: str | None = None,
        memory: str | None = None,
        max_pods: int = 1000,
    ):
        self.kube = Kube(kubeconfig)
        self.state_dir = Path(state_dir)
        self.dir = self.state_dir / "node-agent"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity = {
            "cpu": cpu or str(os.cpu_count() or 1),
            "memory": memory or total_memory(),
            "pods": str(max_pods),
            "nvidia.com/gpu": str(gpus),
            "ephemeral-storage": "100Gi",
        }
        self._lock = threading.Lock()
        state = self._load_state()
        if state.get("served") is not None:
            self.served: set[str] = set(state["served"])
            self.next_index = dict(state.get("next") or {"node": nodes, "spot": spot_nodes})
        else:
            self.served = {f"local-node-{i}" for i in range(nodes)} | {
                f"local-spot-{i}" for i in range(spot_nodes)
            }
            self.next_index = {"node": nodes, "spot": spot_nodes}
        # preemption request ids (random) in the order they were handled: a dict keeps insertion order, so the
        # saved state keeps the newest 200, not the alphabetically largest
        self.handled: dict[str, None] = dict.fromkeys(state.get("handled") or [])
        self._stop = threading.Event()
        self.pods = Informer(self.kube, "/api/v1/pods", "pods")
        self.nodes = Informer(self.kube, "/api/v1/nodes", "nodes")
        self.kubelet = Kubelet(self.kube, self.pods, self.nodes, self.state_dir, self.served)
        self.scheduler = scheduler_mod.Scheduler(self.kube, self.pods, self.nodes)
        self.nodes.listeners.append(self._on_node)

    # --- persistent state (which nodes this agent serves survives a restart) -------------------------------------
    def _load_state(self) -> Obj:
        try:
            return json.loads((self.dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(
            json.dumps(
                {"served": sorted(self.served), "next": self.next_index, "handled": list(self.handled)[-200:]}
            )
        )
        tmp.replace(self.dir / "state.json")

    # --- nodes -------------------------------------------------------------------------------------------------------
    def _node_object(self, name: str) -> Obj:
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "local",
            "ftjob.dev/local-node": "true",
        }
        if name.startswith("local-spot-"):
            labels[SPOT_LABEL] = "true"
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {},
            "status": self._node_status(None),
        }

    def _node_status(self, current: Obj | None) -> Obj:
        conds = ((current or {}).get("status") or {}).get("conditions") or []
        for ctype in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            conds = set_condition(
                conds,
                ctype,
                "False",
                f"KubeletHasNo{ctype}" if ctype != "PIDPressure" else "KubeletHasSufficientPID",
                "",
            )
        conds = set_condition(conds, "Ready", "True", "KubeletReady", "local kubelet is posting ready status")
        now = now_rfc3339()
        for c in conds:
            c["lastHeartbeatTime"] = now
            c.pop("lastProbeTime", None)
        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": conds,
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": HOST_IP},
            ],
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "local-process://1",
                "osImage": "ftjob local",
                "kernelVersion": os.uname().release,
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        }

    def register(self, name: str) -> None:
        try:
            self.kube.request("POST", "/api/v1/nodes", body=self._node_object(name))
        except ApiError as e:
            if e.status != 409:
                raise
        self.heartbeat(name)
        log.info("node %s registered", name)

    def heartbeat(self, name: str) -> None:
        current = self.nodes.get("", name) or self.kube.get(node_path(name))
        try:
            self.kube.merge_patch(node_path(name, "status"), {"status": self._node_status(current)})
        except ApiError as e:
            if e.status == 404:
                return
            raise
        self._renew_lease(name)

    def _renew_lease(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": format_time_micro(datetime.now(timezone.utc)),
        }
        try:
            try:
                self.kube.merge_patch(f"{path}/{name}", {"spec": spec})
            except ApiError as e:
                if e.status != 404:
                    raise
                self.kube.request(
                    "POST",
                    path,
                    body={
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
                        "spec": spec,
                    },
                )
        except ApiError as e:  # leases are a nicety here: the Ready condition is what the scheduler reads
            log.debug("lease for %s: %s", name, e)

    def add_node(self, kind: str) -> str:
        with self._lock:
            index = self.next_index.get(kind, 0)
            self.next_index[kind] = index + 1
            name = f"local-{kind}-{index}"
            self.served.add(name)
            self._save_state()
        self.register(name)
        self.kubelet.wake.set()
        return name

    def stop_serving(self, name: str) -> None:
        with self._lock:
            self.served.discard(name)
            self._save_state()
        for worker in list(self.kubelet.workers.values()):
            if worker.node == name:
                worker.kill()
        self.kubelet.wake.set()

    # --- what a Preemption uses (preempt.NodeHost) ------------------------------------------------------------------
    def pods_on(self, node: str) -> list[Obj]:
        return [p for p in self.pods.items() if (p.get("spec") or {}).get("nodeName") == node]

    def set_pod_condition(self, uid: str, ctype: str, status: str, reason: str, message: str) -> bool:
        worker = self.kubelet.worker_for(uid)
        if worker is None:
            return False
        worker.add_condition(ctype, status, reason, message)
        return True

    def _on_node(self, kind: str, node: Obj) -> None:
        name = meta(node).get("name")
        if kind == "DELETED":
            if name in self.served:
                log.info("node %s was deleted: its pods die with it", name)
                self.stop_serving(name)
            return
        req = request_of(node)
        if req and name in self.served and req["id"] not in self.handled:
            with self._lock:
                self.handled[req["id"]] = None
                self._save_state()
            log.info("node %s: preemption requested %s", name, req)
            Preemption(self, node, req).start()

    # --- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        for inf in (self.nodes, self.pods):
            inf.start()
        for name in sorted(self.served):
            self.register(name)
        self._save_state()
        for inf in (self.nodes, self.pods):
            if not inf.synced.wait(30):
                raise RuntimeError(f"could not list {inf.name} from the API server within 30s")
        self.kubelet.start()
        self.scheduler.start()
        threading.Thread(target=self._heartbeats, name="heartbeats", daemon=True).start()
        (self.dir / "ready").write_text(json.dumps({"pid": os.getpid(), "nodes": sorted(self.served)}))

    def _heartbeats(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            for name in sorted(self.served):
                try:
                    self.heartbeat(name)
                except Exception as e:
                    log.warning("heartbeat of %s failed: %s", name, e)

    def shutdown(self, kill_pods: bool = True) -> None:
        """Stops the agent. With kill_pods (the cluster goes down) every pod process is killed and the nodes are
        marked NotReady; without (a restart, as a real kubelet's), pods and node status stay as they are."""
        self._stop.set()
        (self.dir / "ready").unlink(missing_ok=True)
        self.kubelet.shutdown(kill_pods=kill_pods)
        self.scheduler.stop()
        if not kill_pods:
            return
        for name in sorted(self.served):  # what the node lifecycle controller would say after 40 s
            try:
                current = self.nodes.get("", name) or {}
                conds = set_condition(
                    (current.get("status") or {}).get("conditions") or [],
                    "Ready",
                    "Unknown",
                    "NodeStatusUnknown",
                    "Kubelet stopped posting node status.",
                )
                self.kube.merge_patch(node_path(name, "status"), {"status": {"conditions": conds}})
            except Exception:
                pass
