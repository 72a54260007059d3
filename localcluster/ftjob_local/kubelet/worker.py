"""PodWorker: one pod's life in its own thread (setup, the container loop, termination, cleanup)."""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from ftjob_trainer.contract import ENV_TERMINATION_LOG, now_rfc3339, parse_time

from ..client import Obj
from ..layout import log_path
from ..objects import is_terminal, meta, pod_path, post_event, set_condition
from ..procs import ContainerProcess
from ..shim import read_status
from .container import ENV_MOUNTS, ConfigError, Ctr, rewrite_paths
from .pod import KubeletHost
from .probes import PodProbes
from .status import PodStatus
from .volumes import PodVolumes

log = logging.getLogger(__name__)

MAX_WAIT = 1.0  # the worker loop wakes on process exit, deletion or this timeout (probes, backoff)


class PodWorker(PodProbes, PodVolumes, PodStatus):
    """Owns one pod's processes and status, in its own thread."""

    def __init__(self, kubelet: KubeletHost, pod: Obj):
        super().__init__(kubelet, pod)
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.ns}-{self.name}", daemon=True)

    # --- called from the kubelet's sync thread ------------------------------------------------------------------
    def update(self, pod: Obj) -> None:
        self.pod = pod
        m = meta(pod)
        if m.get("deletionTimestamp"):
            grace = m.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            deadline = time.monotonic() + max(0, int(grace))
            # A second delete may shorten the grace period (kubectl delete --grace-period=1 after a first delete).
            if self.grace_deadline is None or deadline < self.grace_deadline:
                self.grace_deadline = deadline
            self.delete_requested.set()
            self.wake.set()

    def object_gone(self, last: Obj) -> None:
        """The pod was removed from the API without us: a graceful end only if the server said so."""
        self.gone = True
        m = meta(last)
        grace = m.get("deletionGracePeriodSeconds") if m.get("deletionTimestamp") else 0
        if self.grace_deadline is None:
            self.grace_deadline = time.monotonic() + max(0, int(grace or 0))
        self.delete_requested.set()
        self.wake.set()

    def kill(self) -> None:
        """SIGKILL everything now (node gone, hard preemption, agent shutdown)."""
        self.kill_now = True
        self.grace_deadline = time.monotonic()
        self.delete_requested.set()
        self.wake.set()

    def add_condition(self, ctype: str, status: str, reason: str, message: str) -> None:
        self.extra_conditions = set_condition(self.extra_conditions, ctype, status, reason, message)
        self._patch_status(force=True)

    # --- the pod's life -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._live()
        except Exception:
            log.exception("pod %s/%s: worker failed", self.ns, self.name)
            self._kill_all(signal.SIGKILL)
        finally:
            self._finish()

    def _live(self) -> None:
        if is_terminal(self.pod):
            self.terminal = True
            return
        self._setup()
        self._patch_status(force=True)
        while not self.delete_requested.is_set():
            self.wake.clear()
            now = time.monotonic()
            if not self.initialized:
                self._step_init(now)
            else:
                for c in self.ctrs:
                    self._step_container(c, now)
                self._probe(now)
            self._patch_status()
            if self.initialized and all(c.done for c in self.ctrs) or self._init_failed():
                # Terminal: nothing runs any more, so the thread ends; the kubelet deletes the pod's folder
                # when the object goes.
                # The final status must land even if the API server is away for a while.
                while (
                    not self._patch_status(force=True)
                    and not self.gone
                    and not self.delete_requested.is_set()
                ):
                    self.wake.wait(1.0)
                    self.wake.clear()
                self.terminal = True
                return
            self.wake.wait(self._timeout())
        self._terminate()

    def _timeout(self) -> float:
        """Seconds until the next probe or restart is due (process exits wake the loop by themselves)."""
        now = time.monotonic()
        due = [now + MAX_WAIT]
        for c in self.inits + self.ctrs:
            if c.proc is None and not c.done:
                due.append(c.next_start)
            if c.proc is not None:
                for kind in ("readinessProbe", "livenessProbe"):
                    probe = c.spec.get(kind)
                    if probe:
                        due.append(
                            c.probe_next.get(
                                kind, c.started_mono + float(probe.get("initialDelaySeconds", 0))
                            )
                        )
        return min(MAX_WAIT, max(0.01, min(due) - now))

    def _adopt_previous_status(self) -> bool:
        """After a kubelet (node agent) restart, what the pod's containers were doing: one whose shim still runs is
        adopted and goes on (a kubelet restart costs a running pod nothing); one that ended meanwhile reports the
        status its shim wrote; one that left no trace is reported as Kubernetes reports a lost container
        (ContainerStatusUnknown, 137). True when a running container was adopted."""
        previous = {s.get("name"): s for s in (self.pod.get("status") or {}).get("containerStatuses") or []}
        adopted = False
        for c in self.ctrs:
            s = previous.get(c.name)
            if not s:
                continue
            c.restart_count = int(s.get("restartCount") or 0)
            c.last_state = s.get("lastState") or {}
            running = (s.get("state") or {}).get("running")
            if running is None:
                continue
            self.initialized = True
            if self._adopt(c, running, bool(s.get("ready"))):
                adopted = True
                continue
            c.state = {
                "terminated": {
                    "exitCode": 137,
                    "reason": "ContainerStatusUnknown",
                    "message": "The container could not be located when the node agent restarted",
                    "startedAt": running.get("startedAt"),
                    "finishedAt": now_rfc3339(),
                }
            }
            self._after_exit(c, 137)
        return adopted

    def _adopt(self, c: Ctr, running: Obj, ready: bool) -> bool:
        """Takes over the container's shim recorded in its pid file, if that process or its exit status is there."""
        cdir = self.dir / "containers" / c.name
        try:
            pid, start, *marker = (cdir / "pid").read_text().split()
            proc = ContainerProcess(int(pid), start, self._exit_file(c))
        except (OSError, ValueError):
            return False
        if proc.poll() is not None and read_status(proc.exit_file) is None:
            return False  # killed with no status written: lost
        c.proc, c.marker = proc, marker[0] if marker else ""
        c.started_at = running.get("startedAt") or now_rfc3339()
        try:
            age = (datetime.now(timezone.utc) - parse_time(c.started_at)).total_seconds()
        except ValueError:
            age = 0.0
        c.started_mono = time.monotonic() - max(0.0, age)
        c.state, c.ready = {"running": {"startedAt": c.started_at}}, ready
        c.log_file = log_path(self.k.state_dir, self.ns, self.name, c.name)
        wd = c.spec.get("workingDir")
        c.cwd = rewrite_paths(wd, self._mounts_for(c)) if wd else str(self.dir / "work")
        try:  # exec probes run with it
            c.env = self._environment(c)
        except ConfigError:
            c.env = {}
        self._follow(c)
        log.info("pod %s/%s: adopted container %s (pid %s)", self.ns, self.name, c.name, proc.pid)
        return True

    def _setup(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pod_ip = self.k.allocate_ip(self.pod)
        self.mounts, notes = self._prepare_volumes()
        for c in self.inits + self.ctrs:
            cdir = self.dir / "containers" / c.name
            cdir.mkdir(parents=True, exist_ok=True)
            c.term_file = cdir / "termination-log"
        if self._adopt_previous_status():
            return  # the pod was set up by the kubelet before this one, which posted what follows
        image = ", ".join(
            sorted({c.spec.get("image", "") for c in self.inits + self.ctrs if c.spec.get("image")})
        )
        mount_text = "; ".join(f"{m} -> {b}" for m, b in self.mounts) or "none"
        post_event(
            self.k.kube,
            self.pod,
            "LocalEmulation",
            f"Local kubelet: containers run as processes on this machine. Image ({image or 'none'}) is ignored: "
            f"command/args run with {Path(sys.executable).parent} first on PATH. Resource limits are not "
            f"enforced. No network namespace: pod IP {self.pod_ip} is a loopback address"
            + (
                f", its declared ports served by the service proxy (which enforces NetworkPolicy ingress) and "
                f"the containers' own address (status.podIP in the downward API) {self.own_ip}"
                if self.own_ip != self.pod_ip
                else ""
            )
            + ". No mount namespace: "
            f"mountPath prefixes in command/args/env/workingDir are rewritten to folders ({mount_text}; also in "
            f"${ENV_MOUNTS}); the termination message file is given in ${ENV_TERMINATION_LOG}."
            + (" " + " ".join(notes) if notes else ""),
            host=self.node,
        )

    # --- termination ----------------------------------------------------------------------------------------------
    def _terminate(self) -> None:
        running = [c for c in self.inits + self.ctrs if c.proc is not None]
        if running:
            if self.kill_now:
                self._kill_all(signal.SIGKILL)
            else:
                post_event(
                    self.k.kube,
                    self.pod,
                    "Killing",
                    "Stopping container(s) " + ", ".join(c.name for c in running),
                    host=self.node,
                )
                self._kill_all(signal.SIGTERM)
            killed = self.kill_now
            while any(c.proc is not None for c in running):
                if not killed and time.monotonic() >= (self.grace_deadline or 0):
                    self._kill_all(signal.SIGKILL)
                    killed = True
                for c in running:
                    if c.proc is not None and self._reap(c) is not None:
                        c.done = True
                time.sleep(0.05)
            self._patch_status(force=True)
        while not self.gone:  # the final delete, retried while the API server is away
            try:
                self.k.kube.delete(pod_path(self.ns, self.name), grace=0, uid=self.uid)
                break
            except Exception as e:
                log.warning("pod %s/%s: final delete failed (retrying): %s", self.ns, self.name, e)
                time.sleep(1.0)

    def _finish(self) -> None:
        self.k.release_ip(self.pod_ip)
        for c in self.inits + self.ctrs:
            if c.proc is not None:  # only on a worker crash
                self._signal(c, signal.SIGKILL)
        if self.gone or meta(self.pod).get("deletionTimestamp"):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.finished.set()
        self.k.worker_finished(self.uid)
