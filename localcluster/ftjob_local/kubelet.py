"""The local kubelet: runs the containers of pods bound to its nodes as local processes.

What it emulates and how (also posted as a pod event, reason LocalEmulation):
- image: ignored; command+args run as a process in its own process group (session), with `PATH` starting with
  the directory of the Python running ftjob, so `python` and `torchrun` are ftjob's. Without a command, args run
  alone, as an entrypoint that execs its arguments (tini, `exec "$@"`) would run them.
- network: each pod gets its own loopback address in 127.10.0.0/16 (status.podIP); there is no isolation.
- volumes: emptyDir -> DIR/pods/<uid>/volumes/<name>, persistentVolumeClaim -> DIR/pvcs/<ns>/<claim> (shared like a
  RWX volume), hostPath as is, secret/configMap/downwardAPI -> files. There is no mount namespace, so every
  absolute mountPath prefix found in command, args, env values and workingDir is rewritten to its folder, and
  FTJOB_LOCAL_MOUNTS holds the mapping as JSON. Paths a program builds on its own are not rewritten.
- termination message: terminationMessagePath (also rewritten where it appears) is a real file, also named by
  $FTJOB_TERMINATION_LOG; its content becomes state.terminated.message.
- resources: requests count for scheduling only; limits are not enforced (no OOMKilled).
Logs (stdout and stderr together) go to DIR/logs/<namespace>/<pod>/<container>.log, the file the API server serves
for `kubectl logs`; on a restart the previous run's log moves to <container>.previous.log (`kubectl logs -p`).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.utils.quantity import parse_quantity

from .node.api import ApiError, Informer, Kube, Obj, now_rfc3339
from .node.common import condition, is_terminal, meta, pod_path, post_event, set_condition
from .procs import MARKER_ENV, _cpu_start_time, kill_marked, kill_tree

log = logging.getLogger(__name__)

POD_CIDR_PREFIX = "127.10"
HOST_IP = "127.0.0.1"
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
ENV_TERMINATION_LOG = "FTJOB_TERMINATION_LOG"  # = ftjob_trainer.contract.ENV_TERMINATION_LOG
ENV_MOUNTS = "FTJOB_LOCAL_MOUNTS"
BACKOFF_START, BACKOFF_MAX = (
    1.0,
    30.0,
)  # restart backoff (Kubernetes: 10 s doubling to 300 s), short for local use
MAX_WAIT = 1.0  # the worker loop wakes on process exit, deletion or this timeout (probes, backoff)
_KUBELET_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers")
_HOST_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER", "LOGNAME")


def log_path(state_dir: Path, namespace: str, name: str, container: str, previous: bool = False) -> Path:
    """The API server reads the same path (apiserver.server logs_dir)."""
    return (
        Path(state_dir) / "logs" / namespace / name / (container + (".previous.log" if previous else ".log"))
    )


# --- $(VAR) expansion, as Kubernetes does it ------------------------------------------------------------------
def expand(value: str, env: dict[str, str]) -> str:
    """$(VAR) -> env[VAR] when defined (else left as is); $$ -> $."""
    out, i, n = [], 0, len(value)
    while i < n:
        ch = value[i]
        if ch == "$" and i + 1 < n:
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = value.find(")", i + 2)
                if end != -1:
                    name = value[i + 2 : end]
                    out.append(env[name] if name in env else value[i : end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


class ConfigError(Exception):
    """The container cannot start yet (missing secret/configMap key, no command): reason + message."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def rewrite_paths(value: str, mounts: list[tuple[str, str]]) -> str:
    """Replaces absolute mount paths at path boundaries by their backing folders, in one pass (longest first).

    A path that exists on this machine under a mountPath that is itself a real folder here is left alone: a mount
    at /work must not turn /work/venv/bin/python into a path inside the volume."""
    if not mounts:
        return value
    ordered = sorted(mounts, key=lambda m: -len(m[0].rstrip("/")))
    backing = {m.rstrip("/") or "/": b for m, b in ordered}
    alternatives = "|".join(re.escape(m.rstrip("/")) for m, _ in ordered)
    pattern = r"(?<![\w.\-/])(?P<mount>" + alternatives + r")(?P<rest>/[^\s:;,'\"=]*)?(?=$|[^\w.\-])"

    def swap(match: re.Match) -> str:
        mount, rest = match.group("mount"), match.group("rest") or ""
        if rest and os.path.isdir(mount) and os.path.exists(mount + rest):
            return match.group(0)
        return backing[mount] + rest

    return re.sub(pattern, swap, value)


@dataclass
class Ctr:
    spec: Obj
    init: bool = False
    proc: subprocess.Popen | None = None
    restart_count: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    started_at: str = ""
    started_mono: float = 0.0
    next_start: float = 0.0
    backoff: float = BACKOFF_START
    done: bool = False  # terminated and will not restart
    term_file: Path | None = None
    log_file: Path | None = None
    env: dict = field(default_factory=dict)
    cwd: str = ""
    probe_next: dict = field(default_factory=dict)
    probe_ok: dict = field(default_factory=dict)
    probe_fail: dict = field(default_factory=dict)
    kill_reason: str = ""
    marker: str = ""  # MARKER_ENV's value for the running process and everything it starts

    @property
    def name(self) -> str:
        return self.spec["name"]


class PodWorker:
    """Owns one pod's processes and status, in its own thread."""

    def __init__(self, kubelet: Kubelet, pod: Obj):
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
        self._adopt_previous_status()
        self._setup()
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

    def _init_failed(self) -> bool:
        return any(c.done and c.state.get("terminated", {}).get("exitCode") for c in self.inits)

    def _adopt_previous_status(self) -> None:
        """After a node-agent restart the processes are gone: report them as Kubernetes does for a lost container."""
        previous = {s.get("name"): s for s in (self.pod.get("status") or {}).get("containerStatuses") or []}
        for c in self.ctrs:
            s = previous.get(c.name)
            if not s:
                continue
            c.restart_count = int(s.get("restartCount") or 0)
            if "running" in (s.get("state") or {}):
                self.initialized = True
                c.state = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "ContainerStatusUnknown",
                        "message": "The container could not be located when the node agent restarted",
                        "startedAt": s["state"]["running"].get("startedAt"),
                        "finishedAt": now_rfc3339(),
                    }
                }
                self._after_exit(c, 137)

    def _setup(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pod_ip = self.k.allocate_ip(self.pod)
        self.mounts, notes = self._prepare_volumes()
        for c in self.inits + self.ctrs:
            cdir = self.dir / "containers" / c.name
            cdir.mkdir(parents=True, exist_ok=True)
            c.term_file = cdir / "termination-log"
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
            f"enforced. No network isolation: pod IP {self.pod_ip} is a loopback address. No mount namespace: "
            f"mountPath prefixes in command/args/env/workingDir are rewritten to folders ({mount_text}; also in "
            f"${ENV_MOUNTS}); the termination message file is given in ${ENV_TERMINATION_LOG}."
            + (" " + " ".join(notes) if notes else ""),
            host=self.node,
        )
        self._patch_status(force=True)

    # --- volumes --------------------------------------------------------------------------------------------------
    def _prepare_volumes(self) -> tuple[list[tuple[str, str]], list[str]]:
        notes: list[str] = []
        backing: dict[str, Path] = {}
        for v in (self.pod.get("spec") or {}).get("volumes") or []:
            name = v["name"]
            vdir = self.dir / "volumes" / name
            if "emptyDir" in v:
                vdir.mkdir(parents=True, exist_ok=True)
                backing[name] = vdir
            elif "persistentVolumeClaim" in v:
                p = self.k.state_dir / "pvcs" / self.ns / v["persistentVolumeClaim"]["claimName"]
                p.mkdir(parents=True, exist_ok=True)
                backing[name] = p
            elif "hostPath" in v:
                p = Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") in ("DirectoryOrCreate",) and not p.exists():
                    p.mkdir(parents=True, exist_ok=True)
                backing[name] = p
            elif "secret" in v or "configMap" in v:
                vdir.mkdir(parents=True, exist_ok=True)
                self._write_key_files(v, vdir, notes)
                backing[name] = vdir
            elif "downwardAPI" in v:
                vdir.mkdir(parents=True, exist_ok=True)
                for item in v["downwardAPI"].get("items") or []:
                    if "fieldRef" in item:
                        (vdir / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                        (vdir / item["path"]).write_text(self._field(item["fieldRef"]["fieldPath"]))
                backing[name] = vdir
            else:
                vdir.mkdir(parents=True, exist_ok=True)
                backing[name] = vdir
                kinds = [k for k in v if k != "name"]
                notes.append(
                    f"Volume {name} ({', '.join(kinds)}) is not emulated: it is an empty folder {vdir}."
                )
        mounts: list[tuple[str, str]] = []
        for c in self.inits + self.ctrs:
            for vm in c.spec.get("volumeMounts") or []:
                if vm.get("name") not in backing:
                    continue
                target = backing[vm["name"]] / vm["subPath"] if vm.get("subPath") else backing[vm["name"]]
                if vm.get("subPath"):
                    target.mkdir(parents=True, exist_ok=True)
                pair = (vm["mountPath"], str(target))
                if pair not in mounts:
                    mounts.append(pair)
        mounts.sort(key=lambda p: -len(p[0]))
        return mounts, notes

    def _write_key_files(self, v: Obj, vdir: Path, notes: list[str]) -> None:
        src = v.get("secret") or v.get("configMap")
        is_secret = "secret" in v
        name = src.get("secretName") if is_secret else src.get("name")
        obj = self.k.kube.get(
            f"/api/v1/namespaces/{self.ns}/{'secrets' if is_secret else 'configmaps'}/{name}"
        )
        if obj is None:
            if not src.get("optional"):
                notes.append(
                    f"{'Secret' if is_secret else 'ConfigMap'} {name} of volume {v['name']} not found."
                )
            return
        data = (
            {k: base64.b64decode(val) for k, val in (obj.get("data") or {}).items()}
            if is_secret
            else {
                **{k: val.encode() for k, val in (obj.get("data") or {}).items()},
                **{k: base64.b64decode(val) for k, val in (obj.get("binaryData") or {}).items()},
            }
        )
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] in data:
                f = vdir / item["path"]
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_bytes(data[item["key"]])

    # --- environment -----------------------------------------------------------------------------------------------
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
            "status.podIP": self.pod_ip,
            "status.podIPs": self.pod_ip,
            "status.hostIP": HOST_IP,
            "status.hostIPs": HOST_IP,
        }
        if path in simple:
            return simple[path] or ""
        if path in ("metadata.labels", "metadata.annotations"):
            return "\n".join(f'{k}="{v}"' for k, v in sorted((m.get(path.split(".")[1]) or {}).items()))
        raise ConfigError("CreateContainerConfigError", f"unsupported fieldRef fieldPath {path!r}")

    def _resource(self, c: Ctr, ref: Obj) -> str:
        res = c.spec.get("resources") or {}
        kind, _, resource = ref["resource"].partition(".")
        value = (res.get(kind) or {}).get(resource)
        if value is None:
            node = self.k.nodes.get("", self.node) or {}
            value = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
        q = parse_quantity(value) / parse_quantity(ref.get("divisor", "1") or "1")
        return str(math.ceil(q) if resource == "cpu" else int(q.to_integral_value(rounding="ROUND_CEILING")))

    def _key_ref(self, kind: str, ref: Obj) -> str | None:
        plural = "secrets" if kind == "secret" else "configmaps"
        obj = self.k.kube.get(f"/api/v1/namespaces/{self.ns}/{plural}/{ref.get('name')}")
        data = (obj or {}).get("data") or {}
        if obj is None or ref["key"] not in data:
            if ref.get("optional"):
                return None
            what = "secret" if kind == "secret" else "configmap"
            missing = (
                f'{what} "{ref.get("name")}" not found'
                if obj is None
                else f"couldn't find key {ref['key']} in {what.capitalize()} {self.ns}/{ref.get('name')}"
            )
            raise ConfigError("CreateContainerConfigError", missing)
        value = data[ref["key"]]
        return base64.b64decode(value).decode(errors="replace") if kind == "secret" else value

    def _environment(self, c: Ctr) -> dict[str, str]:
        env = {k: os.environ[k] for k in _HOST_ENV if k in os.environ}
        env["PATH"] = os.pathsep.join(
            [str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
        )
        env["HOSTNAME"] = self.name
        for src in c.spec.get("envFrom") or []:
            kind = "secret" if "secretRef" in src else "configmap"
            ref = src.get("secretRef") or src.get("configMapRef") or {}
            obj = self.k.kube.get(
                f"/api/v1/namespaces/{self.ns}/{'secrets' if kind == 'secret' else 'configmaps'}"
                f"/{ref.get('name')}"
            )
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError("CreateContainerConfigError", f'{kind} "{ref.get("name")}" not found')
            for k, val in (obj.get("data") or {}).items():
                env[src.get("prefix", "") + k] = (
                    base64.b64decode(val).decode(errors="replace") if kind == "secret" else val
                )
        for e in c.spec.get("env") or []:
            if "valueFrom" in e:
                vf = e["valueFrom"]
                if "fieldRef" in vf:
                    value = self._field(vf["fieldRef"]["fieldPath"])
                elif "resourceFieldRef" in vf:
                    value = self._resource(c, vf["resourceFieldRef"])
                elif "secretKeyRef" in vf:
                    value = self._key_ref("secret", vf["secretKeyRef"])
                elif "configMapKeyRef" in vf:
                    value = self._key_ref("configmap", vf["configMapKeyRef"])
                else:
                    raise ConfigError(
                        "CreateContainerConfigError", f"env {e['name']}: unsupported valueFrom {vf}"
                    )
                if value is None:
                    continue
            else:
                value = expand(e.get("value", ""), env)
            env[e["name"]] = rewrite_paths(value, self._mounts_for(c))
        env["PATH"] = (
            str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
            if not env["PATH"].startswith(str(Path(sys.executable).parent) + os.pathsep)
            else env["PATH"]
        )
        env[ENV_TERMINATION_LOG] = str(c.term_file)
        env[ENV_MOUNTS] = json.dumps(dict(self._mounts_for(c)))
        return env

    def _mounts_for(self, c: Ctr) -> list[tuple[str, str]]:
        own = {vm["mountPath"] for vm in c.spec.get("volumeMounts") or []}
        mounts = [m for m in self.mounts if m[0] in own]
        mounts.append((c.spec.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH, str(c.term_file)))
        return sorted(mounts, key=lambda p: -len(p[0]))

    # --- processes ---------------------------------------------------------------------------------------------------
    def _start(self, c: Ctr) -> None:
        try:
            c.env = self._environment(c)
            command = [expand(x, c.env) for x in c.spec.get("command") or []]
            args = [expand(x, c.env) for x in c.spec.get("args") or []]
            if not command and not args:
                raise ConfigError(
                    "CreateContainerError",
                    f"container {c.name} has neither command nor args: the local kubelet cannot run "
                    "the image's entrypoint or CMD; set args (or command)",
                )
            mounts = self._mounts_for(c)
            argv = [rewrite_paths(x, mounts) for x in command + args]
        except ConfigError as e:
            if c.state.get("waiting", {}).get("message") != str(e):
                post_event(self.k.kube, self.pod, "Failed", f"Error: {e}", type_="Warning", host=self.node)
            c.state = {"waiting": {"reason": e.reason, "message": str(e)}}
            c.next_start = time.monotonic() + 1.0
            return
        wd = c.spec.get("workingDir")
        cwd = Path(rewrite_paths(wd, mounts)) if wd else self.dir / "work"
        try:
            cwd.mkdir(parents=True, exist_ok=True)
        except OSError:
            cwd = self.dir / "work"
            cwd.mkdir(parents=True, exist_ok=True)
        c.cwd = str(cwd)
        c.term_file.write_bytes(b"")
        c.log_file = log_path(self.k.state_dir, self.ns, self.name, c.name)
        c.log_file.parent.mkdir(parents=True, exist_ok=True)
        if (c.restart_count or c.last_state) and c.log_file.exists():
            c.log_file.replace(log_path(self.k.state_dir, self.ns, self.name, c.name, previous=True))
        elif not c.started_mono:  # a new pod that reuses an old pod's name starts with empty logs
            c.log_file.unlink(missing_ok=True)
            log_path(self.k.state_dir, self.ns, self.name, c.name, previous=True).unlink(missing_ok=True)
        with open(c.log_file, "ab") as out:
            try:
                c.marker = f"{self.uid}/{c.name}/{os.urandom(4).hex()}"
                c.proc = subprocess.Popen(
                    argv,
                    cwd=c.cwd,
                    env={**c.env, MARKER_ENV: c.marker},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                c.state = {
                    "waiting": {"reason": "CreateContainerError", "message": f"cannot run {argv[0]!r}: {e}"}
                }
                post_event(
                    self.k.kube,
                    self.pod,
                    "Failed",
                    f"Error: cannot run {argv[0]!r}: {e}",
                    type_="Warning",
                    host=self.node,
                )
                c.next_start = time.monotonic() + c.backoff
                c.backoff = min(BACKOFF_MAX, c.backoff * 2)
                if (self.pod.get("spec") or {}).get("restartPolicy", "Always") == "Never":
                    c.state = {
                        "terminated": {
                            "exitCode": 128,
                            "reason": "StartError",
                            "message": str(e),
                            "startedAt": None,
                            "finishedAt": now_rfc3339(),
                        }
                    }
                    c.done = True
                return
        proc = c.proc
        threading.Thread(
            target=lambda: (proc.wait(), self.wake.set()), name=f"wait-{proc.pid}", daemon=True
        ).start()
        (self.dir / "containers" / c.name / "pid").write_text(
            f"{c.proc.pid} {_cpu_start_time(c.proc.pid)} {c.marker}"
        )
        c.started_at, c.started_mono = now_rfc3339(), time.monotonic()
        c.state = {"running": {"startedAt": c.started_at}}
        c.ready = False
        c.probe_next, c.probe_ok, c.probe_fail = {}, {}, {}
        post_event(
            self.k.kube, self.pod, "Started", f"Started container {c.name} (pid {c.proc.pid})", host=self.node
        )

    def _reap(self, c: Ctr) -> int | None:
        """Returns the container's exit code once its process ended (128+n for signal n)."""
        if c.proc is None:
            return None
        rc = c.proc.poll()
        if rc is None:
            return None
        # No child outlives the main process: its process group, and what left it (sessions of their own,
        # reparented once the main process died) found by the container's marker.
        try:
            os.killpg(c.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        kill_marked(c.marker)
        c.proc = None
        code = 128 - rc if rc < 0 else rc
        message = self._termination_message(c, code)
        term = {
            "exitCode": code,
            "reason": c.kill_reason or ("Completed" if code == 0 else "Error"),
            "startedAt": c.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": f"local://{self.uid}/{c.name}",
        }
        if rc < 0:
            term["signal"] = -rc
        if message:
            term["message"] = message
        c.state = {"terminated": term}
        c.ready = False
        c.kill_reason = ""
        return code

    def _termination_message(self, c: Ctr, code: int) -> str:
        try:
            text = c.term_file.read_bytes()[:4096].decode(errors="replace") if c.term_file else ""
        except OSError:
            text = ""
        if (
            not text
            and code != 0
            and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
            and c.log_file
        ):
            try:
                lines = c.log_file.read_bytes().decode(errors="replace").splitlines()[-80:]
                text = "\n".join(lines)[-2048:]
            except OSError:
                pass
        return text

    def _after_exit(self, c: Ctr, code: int) -> None:
        policy = (self.pod.get("spec") or {}).get("restartPolicy", "Always")
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if c.init:
            restart = code != 0 and policy != "Never"
        if not restart:
            c.done = True
            return
        if time.monotonic() - c.started_mono > 60:
            c.backoff = BACKOFF_START
        c.last_state = c.state
        c.next_start = time.monotonic() + c.backoff
        c.backoff = min(BACKOFF_MAX, c.backoff * 2)
        c.restart_count += 1
        c.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {c.backoff / 2:.0f}s restarting failed container={c.name} "
                f"pod={self.name}_{self.ns}({self.uid})",
            }
        }

    def _step_container(self, c: Ctr, now: float) -> None:
        if c.done:
            return
        if c.proc is None:
            if now >= c.next_start:
                self._start(c)
            return
        code = self._reap(c)
        if code is not None:
            self._after_exit(c, code)

    def _step_init(self, now: float) -> None:
        for c in self.inits:
            if c.done:
                continue
            self._step_container(c, now)
            if not c.done:
                return
            if c.state.get("terminated", {}).get("exitCode"):
                return  # failed under restartPolicy Never: the pod fails
        self.initialized = True

    # --- probes -------------------------------------------------------------------------------------------------------
    def _run_probe(self, c: Ctr, probe: Obj) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                h = probe["httpGet"]
                port = self._port(c, h.get("port"))
                host = h.get("host") or self.pod_ip
                url = f"{h.get('scheme', 'HTTP').lower()}://{host}:{port}{h.get('path', '/')}"
                req = urllib.request.Request(
                    url, headers={x["name"]: x["value"] for x in h.get("httpHeaders") or []}
                )
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    return 200 <= resp.status < 400
            if "tcpSocket" in probe:
                t = probe["tcpSocket"]
                with socket.create_connection(
                    (t.get("host") or self.pod_ip, self._port(c, t.get("port"))), timeout
                ):
                    return True
            if "exec" in probe:
                argv = [
                    rewrite_paths(expand(x, c.env), self._mounts_for(c))
                    for x in probe["exec"].get("command") or []
                ]
                return (
                    subprocess.run(
                        argv,
                        env=c.env,
                        cwd=c.cwd or None,
                        timeout=timeout,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    ).returncode
                    == 0
                )
        except Exception:
            return False
        return True

    def _port(self, c: Ctr, port) -> int:
        if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"unknown named port {port}")

    def _probe(self, now: float) -> None:
        for c in self.ctrs:
            if c.proc is None:
                continue
            for kind in ("readinessProbe", "livenessProbe"):
                probe = c.spec.get(kind)
                if not probe:
                    if kind == "readinessProbe":
                        c.ready = True
                    continue
                due = c.probe_next.get(kind, c.started_mono + float(probe.get("initialDelaySeconds", 0)))
                if now < due:
                    continue
                c.probe_next[kind] = now + float(probe.get("periodSeconds", 10))
                if self._run_probe(c, probe):
                    c.probe_ok[kind] = c.probe_ok.get(kind, 0) + 1
                    c.probe_fail[kind] = 0
                    if kind == "readinessProbe" and c.probe_ok[kind] >= int(probe.get("successThreshold", 1)):
                        c.ready = True
                else:
                    c.probe_fail[kind] = c.probe_fail.get(kind, 0) + 1
                    c.probe_ok[kind] = 0
                    if c.probe_fail[kind] >= int(probe.get("failureThreshold", 3)):
                        if kind == "readinessProbe":
                            c.ready = False
                        else:
                            post_event(
                                self.k.kube,
                                self.pod,
                                "Unhealthy",
                                f"Liveness probe failed; restarting container {c.name}",
                                type_="Warning",
                                host=self.node,
                            )
                            c.probe_fail[kind] = 0
                            self._signal(c, signal.SIGKILL)

    # --- status -------------------------------------------------------------------------------------------------------
    def _container_status(self, c: Ctr) -> Obj:
        s = {
            "name": c.name,
            "image": c.spec.get("image", ""),
            "imageID": "",
            "ready": c.ready,
            "restartCount": c.restart_count,
            "started": c.proc is not None,
            "state": c.state,
            "lastState": c.last_state,
        }
        if c.proc is not None:
            s["containerID"] = f"local://{self.uid}/{c.name}"
        return s

    def _phase(self) -> str:
        if not self.initialized:
            return "Failed" if self._init_failed() else "Pending"
        if all(c.done for c in self.ctrs):
            codes = [c.state.get("terminated", {}).get("exitCode", 1) for c in self.ctrs]
            return "Succeeded" if all(x == 0 for x in codes) else "Failed"
        if any(c.proc is not None or c.restart_count or "terminated" in c.state for c in self.ctrs):
            return "Running"
        return "Pending"

    def _status(self) -> Obj:
        phase = self._phase()
        current = (self.pod.get("status") or {}).get("conditions") or []
        ready = phase == "Running" and all(c.ready for c in self.ctrs)
        conds = [c for c in current if c.get("type") not in _KUBELET_CONDITIONS]
        extra_types = {c["type"] for c in self.extra_conditions}
        conds = [c for c in conds if c.get("type") not in extra_types] + self.extra_conditions
        mine = [c for c in current if c.get("type") in _KUBELET_CONDITIONS]
        mine = set_condition(mine, "PodScheduled", "True")
        mine = set_condition(mine, "PodReadyToStartContainers", "True")
        mine = set_condition(
            mine,
            "Initialized",
            "True" if self.initialized else "False",
            "" if self.initialized else "ContainersNotInitialized",
        )
        reason = (
            "" if ready else ("PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady")
        )
        mine = set_condition(mine, "ContainersReady", "True" if ready else "False", reason)
        mine = set_condition(mine, "Ready", "True" if ready else "False", reason)
        status: Obj = {
            "phase": phase,
            "conditions": mine + conds,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": (self.pod.get("status") or {}).get("startTime") or now_rfc3339(),
            "containerStatuses": [self._container_status(c) for c in self.ctrs],
        }
        if self.inits:
            status["initContainerStatuses"] = [self._container_status(c) for c in self.inits]
        return status

    def _patch_status(self, force: bool = False) -> bool:
        """Writes the pod's status if it changed (or force); False when the write failed (retried later)."""
        if self.gone or not self.pod_ip:
            return True
        status = self._status()
        comparable = json.dumps(
            {
                **status,
                "conditions": [
                    {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status["conditions"]
                ],
            },
            sort_keys=True,
        )
        if not force and comparable == self.last_status:
            return True
        try:
            self.pod = self.k.kube.merge_patch(
                pod_path(self.ns, self.name, "status"), {"metadata": {"uid": self.uid}, "status": status}
            )
            self.last_status = comparable
            return True
        except ApiError as e:
            if e.status == 404:
                self.gone = True
                return True
            log.warning("pod %s/%s: status update failed: %s", self.ns, self.name, e)
        except Exception as e:  # the API server may be restarting; retried on the next tick
            log.warning("pod %s/%s: status update failed: %s", self.ns, self.name, e)
        return False

    # --- termination ----------------------------------------------------------------------------------------------
    def _signal(self, c: Ctr, sig: int) -> None:
        if c.proc is not None:
            kill_tree(c.proc.pid, sig)
            if sig == signal.SIGKILL:
                kill_marked(c.marker)

    def _kill_all(self, sig: int) -> None:
        for c in self.inits + self.ctrs:
            self._signal(c, sig)

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
            in_use = self._ips | {
                (p.get("status") or {}).get("podIP") for p in self.pods.items() if not is_terminal(p)
            }
            for _ in range(65534):
                n = self._next_ip
                self._next_ip = 2 if self._next_ip >= 65533 else self._next_ip + 1
                ip = f"{POD_CIDR_PREFIX}.{n >> 8}.{n & 255}"
                if ip not in in_use and (n & 255) not in (0, 255):
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

    def _on_pod(self, kind: str, pod: Obj) -> None:
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
        while not self._stop.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            try:
                self.sync()
            except Exception:
                log.exception("kubelet sync failed")

    def sync(self) -> None:
        nodes = {meta(n)["name"] for n in self.nodes.items()}
        now = time.monotonic()
        for pod in self.pods.items():
            m = meta(pod)
            uid, node = m.get("uid"), (pod.get("spec") or {}).get("nodeName")
            if not node:
                continue
            if node not in nodes:
                self._collect_orphan(pod, now)
                continue
            if uid in self.terminal:
                if m.get("deletionTimestamp"):  # a terminal pod has no processes left: delete it for good
                    self.kube.delete(pod_path(m.get("namespace", "default"), m["name"]), grace=0, uid=uid)
                continue
            if node not in self.served or uid in self.workers:
                continue
            worker = PodWorker(self, pod)
            self.workers[uid] = worker
            worker.update(pod)
            worker.thread.start()
        # Workers whose node is no longer served (deleted / preempted) die at once.
        for uid, worker in list(self.workers.items()):
            if worker.node not in self.served or worker.node not in nodes:
                worker.kill()
            if worker.finished.is_set():
                del self.workers[uid]
                if worker.terminal and not worker.gone:
                    self.terminal.add(uid)
        gone, self._gone = self._gone, set()
        for uid in gone & self.terminal:
            shutil.rmtree(self.state_dir / "pods" / uid, ignore_errors=True)
            self.terminal.discard(uid)

    def _collect_orphan(self, pod: Obj, now: float) -> None:
        """Pod GC: a pod bound to a node that no longer exists is deleted (after a short grace for cache lag)."""
        uid = meta(pod)["uid"]
        first = self._orphan_since.setdefault(uid, now)
        if now - first < 2.0:
            self.wake.set()
            return
        worker = self.workers.get(uid)
        if worker:
            worker.kill()
        m = meta(pod)
        self.kube.delete(pod_path(m.get("namespace", "default"), m["name"]), grace=0, uid=uid)
        self._orphan_since.pop(uid, None)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Kills every pod process (the agent is going away) and waits for the workers to notice."""
        self._stop.set()
        for w in list(self.workers.values()):
            w.gone = True  # keep the pod objects: a restarted agent reports the lost containers
            w.kill()
        deadline = time.monotonic() + timeout
        for w in list(self.workers.values()):
            w.finished.wait(max(0.0, deadline - time.monotonic()))


def pod_ready(pod: Obj) -> bool:
    c = condition(pod, "Ready")
    return bool(c and c.get("status") == "True")
