"""Kubelet: the sync loop that starts a PodWorker for every pod bound to a served node, pod GC, pod addresses.

A pod whose object vanished (deleted with grace 0, garbage-collected, or missing from the API server's list after
it restarted) loses its processes at once (SIGKILL: a graceful deletion had its grace period while the object was
there) and its folder. One that vanished while this kubelet was not running is found when it starts: pod folders
under DIR/pods whose uid no pod object has are killed and removed the same way, before any pod is synced.
A sync looks at the pods whose events came since the last one and at those whose workers ended; every pod only when
the served or existing nodes change, after a failed sync, and every SWEEP_SECONDS (issue 15).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import threading
import time
from pathlib import Path

from ..client import Informer, Kube, Obj, key_of
from ..objects import is_terminal, meta, pod_path
from ..procs import kill_recorded
from .container import HOST_IP
from .worker import PodWorker

log = logging.getLogger(__name__)

POD_CIDR_PREFIX = "127.10"
SWEEP_SECONDS = 30.0  # every pod is synced at least this often, whatever the events said


class Kubelet:
    """Starts a PodWorker for every pod bound to a served node; kills and forgets pods whose node is gone."""

    def __init__(self, kube: Kube, pods: Informer, nodes: Informer, state_dir: Path, served: set[str]):
        self.kube, self.pods, self.nodes = kube, pods, nodes
        self.state_dir = Path(state_dir)
        self.served = served  # node names this agent runs pods for (shared with the agent, which changes it)
        self.workers: dict[str, PodWorker] = {}
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ips: set[str] = set()
        self._ipam_file = self.state_dir / "node-agent" / "ipam.json"
        self._next_ip = self._load_ipam()
        self._orphan_since: dict[str, float] = {}
        # What changed since the last sync: pods by (namespace, name), workers that ended; a change of the served or
        # existing nodes (and SWEEP_SECONDS) syncs every pod. An event costs its own pod, not all of them (issue 15).
        self._dirty: set[tuple[str, str]] = set()
        self._ended: set[str] = set()
        self._events_lock = threading.Lock()
        # held by a sync; shutdown takes it after setting _stop, so no sync can start a worker it would not kill
        self._sync_lock = threading.RLock()
        self._swept: tuple[frozenset, frozenset] | None = None
        self._next_sweep = 0.0
        self.pods_synced = 0  # pods looked at by sync(): what the tests bound
        # pod IP -> uids of the live pod objects that carry it (what a new address must not collide with)
        self._ip_users: dict[str, set[str]] = {}
        self._ip_of: dict[str, str] = {}
        self.terminal: set[str] = set()  # uids of finished pods (no worker thread any more)
        self._gone: set[str] = set()  # terminal pods whose objects were deleted: their folders go
        pods.listeners.append(self._on_pod)
        nodes.listeners.append(lambda *_: self.wake.set())
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)

    def start(self) -> Kubelet:
        self._thread.start()
        return self

    def _load_ipam(self) -> int:
        try:
            return int(json.loads(self._ipam_file.read_text())["next"])
        except (OSError, ValueError, KeyError):
            # A random start: several local clusters on one machine (parallel tests) share 127.10.0.0/16.
            return random.randrange(2, 65000)

    def allocate_ip(self, pod: Obj) -> str:
        if (pod.get("spec") or {}).get("hostNetwork"):
            return HOST_IP
        with self._lock:
            existing = (pod.get("status") or {}).get("podIP")
            if existing and existing.startswith(POD_CIDR_PREFIX + ".") and existing not in self._ips:
                self._ips.add(existing)
                return existing
            for _ in range(65534):
                n = self._next_ip
                self._next_ip = 2 if self._next_ip >= 65533 else self._next_ip + 1
                ip = f"{POD_CIDR_PREFIX}.{n >> 8}.{n & 255}"
                if ip not in self._ips and not self._ip_users.get(ip) and (n & 255) not in (0, 255):
                    break
            else:
                raise RuntimeError("no free pod address in 127.10.0.0/16")
            self._ips.add(ip)
            self._ipam_file.parent.mkdir(parents=True, exist_ok=True)
            self._ipam_file.write_text(json.dumps({"next": self._next_ip}))
            return ip

    def release_ip(self, ip: str) -> None:
        with self._lock:
            self._ips.discard(ip)

    def _track_ip(self, kind: str, pod: Obj) -> None:
        uid = meta(pod).get("uid", "")
        ip = (pod.get("status") or {}).get("podIP")
        if kind == "DELETED" or is_terminal(pod):
            ip = None
        with self._lock:
            old = self._ip_of.pop(uid, None)
            if old is not None:
                self._ip_users[old].discard(uid)
                if not self._ip_users[old]:
                    del self._ip_users[old]
            if ip:
                self._ip_of[uid] = ip
                self._ip_users.setdefault(ip, set()).add(uid)

    def worker_finished(self, uid: str) -> None:
        with self._events_lock:
            self._ended.add(uid)
        self.wake.set()

    def _on_pod(self, kind: str, pod: Obj) -> None:
        self._track_ip(kind, pod)
        with self._events_lock:
            self._dirty.add(key_of(pod))
        uid = meta(pod).get("uid")
        worker = self.workers.get(uid)
        if worker is not None:
            if kind == "DELETED":
                worker.object_gone(pod)
            else:
                worker.update(pod)
        elif kind == "DELETED" and uid in self.terminal:
            self._gone.add(uid)
        self.wake.set()

    def worker_for(self, uid: str) -> PodWorker | None:
        return self.workers.get(uid)

    def _run(self) -> None:
        self.pods.synced.wait()
        self.nodes.synced.wait()
        for pod in self.pods.items():  # addresses of pods listed before this kubelet listened
            self._track_ip("MODIFIED", pod)
        self._housekeeping()
        while not self._stop.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            try:
                self.sync()
            except Exception:
                log.exception("kubelet sync failed")
                self._next_sweep = 0.0  # what that sync had left is looked at again, with everything else

    def sync(self) -> None:
        with self._sync_lock:
            if not self._stop.is_set():
                self._sync()

    def _sync(self) -> None:
        nodes = {meta(n)["name"] for n in self.nodes.items()}
        now = time.monotonic()
        with self._events_lock:
            dirty, self._dirty = self._dirty, set()
            ended, self._ended = self._ended, set()
        seen = (frozenset(self.served), frozenset(nodes))
        if seen != self._swept or now >= self._next_sweep:
            self._swept, self._next_sweep = seen, now + SWEEP_SECONDS
            pods, workers = self.pods.items(), list(self.workers.items())
        else:
            workers = [(u, self.workers[u]) for u in ended if u in self.workers]
            # an ended worker's pod: terminal now (deleted for good once asked), or to be started again
            dirty |= {(w.ns, w.name) for _, w in workers}
            pods = [p for p in (self.pods.get(*key) for key in sorted(dirty)) if p is not None]
        # Workers whose node is no longer served (deleted / preempted) die at once.
        for uid, worker in workers:
            if worker.node not in self.served or worker.node not in nodes:
                worker.kill()
            if worker.finished.is_set():
                del self.workers[uid]
                if worker.terminal and not worker.gone:
                    self.terminal.add(uid)
        for pod in pods:
            self.pods_synced += 1
            self._sync_pod(pod, nodes, now)
        gone, self._gone = self._gone, set()
        for uid in gone & self.terminal:
            shutil.rmtree(self.state_dir / "pods" / uid, ignore_errors=True)
            self.terminal.discard(uid)

    def _sync_pod(self, pod: Obj, nodes: set[str], now: float) -> None:
        m = meta(pod)
        uid, node = m.get("uid"), (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        if node not in nodes:
            self._collect_orphan(pod, now)
            return
        if uid in self.terminal:
            if m.get("deletionTimestamp"):  # a terminal pod has no processes left: delete it for good
                self.kube.delete(pod_path(m.get("namespace", "default"), m["name"]), grace=0, uid=uid)
            return
        if node not in self.served or uid in self.workers:
            return
        worker = PodWorker(self, pod)
        self.workers[uid] = worker
        worker.update(pod)
        worker.thread.start()

    def _housekeeping(self) -> None:
        """Kills and removes what pods deleted while no kubelet ran left behind (their uids no object has)."""
        known = {meta(p).get("uid") for p in self.pods.items()}
        for pod_dir in sorted((self.state_dir / "pods").glob("*")):
            if pod_dir.is_dir() and pod_dir.name not in known:
                log.info("pod %s is gone from the API server: killing what is left of it", pod_dir.name)
                self._remove_leftovers(pod_dir.name)

    def _remove_leftovers(self, uid: str) -> None:
        pod_dir = self.state_dir / "pods" / uid
        for pid_file in pod_dir.glob("containers/*/pid"):
            kill_recorded(pid_file)
        shutil.rmtree(pod_dir, ignore_errors=True)

    def _collect_orphan(self, pod: Obj, now: float) -> None:
        """Pod GC: a pod bound to a node that no longer exists is deleted (after a short grace for cache lag)."""
        uid = meta(pod)["uid"]
        first = self._orphan_since.setdefault(uid, now)
        if now - first < 2.0:
            with self._events_lock:
                self._dirty.add(key_of(pod))  # looked at again on the next sync, a second from now at most
            return
        worker = self.workers.get(uid)
        if worker:
            worker.kill()
        else:  # its processes may have outlived an earlier kubelet
            self._remove_leftovers(uid)
        m = meta(pod)
        self.kube.delete(pod_path(m.get("namespace", "default"), m["name"]), grace=0, uid=uid)
        self._orphan_since.pop(uid, None)

    def shutdown(self, timeout: float = 10.0, kill_pods: bool = True) -> None:
        """Stops syncing. With kill_pods, kills every pod process and waits for the workers to notice; without,
        leaves them running for the next kubelet to adopt (a kubelet restart)."""
        self._stop.set()
        if not kill_pods:
            return
        with (
            self._sync_lock
        ):  # a sync under way finishes first; none starts after (a finished worker wakes one)
            workers = list(self.workers.values())
        for w in workers:
            w.gone = True  # keep the pod objects: a restarted agent reports the lost containers
            w.kill()
        deadline = time.monotonic() + timeout
        for w in list(self.workers.values()):
            w.finished.wait(max(0.0, deadline - time.monotonic()))
