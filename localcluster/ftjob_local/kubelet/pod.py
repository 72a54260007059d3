"""The state one pod's worker keeps, shared by its sections (volumes, env, processes, probes, status).

Each section is a class in its own module that builds on this one (processes on env, probes on processes);
worker.PodWorker puts them together and runs the pod's life.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Protocol

from ..client import Informer, Kube, Obj
from ..objects import meta, own_ip
from .container import HOST_IP, ConfigError, Ctr


class KubeletHost(Protocol):
    """What a pod's worker uses of the kubelet that runs it (sync.Kubelet)."""

    kube: Kube
    nodes: Informer
    state_dir: Path

    def allocate_ip(self, pod: Obj) -> str: ...

    def release_ip(self, ip: str) -> None: ...

    def worker_finished(self, uid: str) -> None: ...


class PodBase:
    """One pod's identity, folders, containers and flags."""

    def __init__(self, kubelet: KubeletHost, pod: Obj):
        self.k = kubelet
        self.pod = pod
        m = meta(pod)
        self.uid, self.ns, self.name = m["uid"], m.get("namespace", "default"), m["name"]
        self.node = pod["spec"]["nodeName"]
        self.dir = kubelet.state_dir / "pods" / self.uid
        self.delete_requested = threading.Event()
        self.wake = threading.Event()  # set on process exit and on deletion
        self.gone = False  # the API object is gone (force delete / node GC): kill, never patch
        self.kill_now = False
        self.grace_deadline: float | None = None
        self.extra_conditions: list[Obj] = []  # set in-process (DisruptionTarget), merged into every patch
        self.pod_ip = ""
        self.mounts: list[tuple[str, str]] = []
        self.last_status: Obj | None = None
        self.finished = threading.Event()
        self.terminal = False
        spec = pod.get("spec") or {}
        self.inits = [Ctr(c, init=True) for c in spec.get("initContainers") or []]
        self.ctrs = [Ctr(c) for c in spec.get("containers") or []]
        self.initialized = not self.inits

    @property
    def own_ip(self) -> str:
        """The address the pod's processes bind (objects.own_ip): the pod IP, or for a pod that declares ports the
        address behind it, the pod IP's declared ports being the service proxy's."""
        return own_ip(self.pod, self.pod_ip)

    def _init_failed(self) -> bool:
        return any(c.done and c.state.get("terminated", {}).get("exitCode") for c in self.inits)

    # --- the downward API: fieldRef values, for env and downwardAPI volumes ---------------------------------------
    def _field(self, path: str) -> str:
        pod, m = self.pod, meta(self.pod)
        match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if match:
            return (m.get(match.group(1)) or {}).get(match.group(2), "")
        simple = {
            "metadata.name": m.get("name"),
            "metadata.namespace": m.get("namespace"),
            "metadata.uid": m.get("uid"),
            "spec.nodeName": self.node,
            "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName"),
            "status.podIP": self.own_ip,
            "status.podIPs": self.own_ip,
            "status.hostIP": HOST_IP,
            "status.hostIPs": HOST_IP,
        }
        if path in simple:
            return simple[path] or ""
        if path in ("metadata.labels", "metadata.annotations"):
            return "\n".join(f'{k}="{v}"' for k, v in sorted((m.get(path.split(".")[1]) or {}).items()))
        raise ConfigError("CreateContainerConfigError", f"unsupported fieldRef fieldPath {path!r}")
