"""Starting, restarting and stopping the local cluster's processes: API server, service proxy, node agent (the
kubelet, with node heartbeats and the scheduler), operator.

Each runs in its own process group with its log in DIR/logs/<component>.log and a run record in
DIR/run/<component>.json (records.py), operators started by hand included. Pods run under the node agent but
outlive it: a restart of any component leaves them running (the restarted kubelet adopts them). `up` starts what
is not running; `restart` stops and starts the components asked for; `down` stops every component in reverse
order and then kills any pod process the node agent recorded, so nothing is left running even when the agent
itself was killed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from . import records
from .procs import _cpu_start_time, kill_recorded, recorded_alive, running

COMPONENTS = ("apiserver", "proxy", "node-agent", "operator")  # the start order; `down` goes in reverse
ALIASES = {"kubelet": "node-agent"}  # what `ftjob local restart` calls them
RESTARTABLE = ("apiserver", "proxy", "kubelet", "operator", "all")
TOKEN_KEY_ENV = "FTJOB_TOKEN_KEY"  # ftjob_operator.tokens: the operator derives job tokens from it


class ClusterError(Exception):
    """Something the user has to fix or look at; the message says what."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def write_kubeconfig(path: Path, server: str) -> None:
    """The administrator's kubeconfig; its cluster entry names the state folder (records.STATE_DIR_EXTENSION)."""
    cluster = {
        "server": server,
        "extensions": [
            {"name": records.STATE_DIR_EXTENSION, "extension": {"stateDir": str(path.parent.resolve())}}
        ],
    }
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ftjob-local",
        "preferences": {},
        "clusters": [{"name": "ftjob-local", "cluster": cluster}],
        "users": [{"name": "ftjob-local", "user": {}}],
        "contexts": [
            {
                "name": "ftjob-local",
                "context": {"cluster": "ftjob-local", "user": "ftjob-local", "namespace": "default"},
            }
        ],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(path)


class LocalCluster:
    def __init__(self, state_dir: Path | str):
        self.dir = Path(state_dir).resolve()
        self.run_dir = records.run_dir(self.dir)
        self.log_dir = self.dir / "logs"
        self.kubeconfig = self.dir / "kubeconfig"

    # --- run records -----------------------------------------------------------------------------------------------
    def _record(self, name: str) -> dict | None:
        return records.read(self.dir, ALIASES.get(name, name))

    def alive(self, name: str) -> dict | None:
        return records.alive(self.dir, ALIASES.get(name, name))

    def components(self) -> list[str]:
        """Every component of the state folder: the four `up` starts, then operators started by hand."""
        return [*COMPONENTS, *records.hand_started(self.dir)]

    def operators(self) -> list[str]:
        return ["operator", *records.hand_started(self.dir)]

    def _spawn(
        self,
        name: str,
        argv: list[str],
        extra: dict | None = None,
        cwd: Path | None = None,
        env: dict | None = None,
    ):
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=cwd or self.dir,
                env={**os.environ, **(env or {}), records.MANAGED_ENV: name},
            )
        rec = {"pid": proc.pid, "start": _cpu_start_time(proc.pid), "argv": argv, **(extra or {})}
        records.write(self.dir, name, rec)
        return proc

    def _log_tail(self, name: str, lines: int = 20) -> str:
        try:
            return "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _wait(self, name: str, proc: subprocess.Popen, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with code {proc.returncode} while starting; last lines of "
                    f"{self.log_dir / (name + '.log')}:\n{self._log_tail(name)}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{name} was not ready after {timeout:.0f}s; see {self.log_dir / (name + '.log')}:"
                    f"\n{self._log_tail(name)}"
                )
            time.sleep(0.1)

    # --- up ----------------------------------------------------------------------------------------------------------
    def up(
        self, nodes: int = 1, spot_nodes: int = 2, operator: bool = True, timeout: float = 60.0, say=print
    ) -> Path:
        """Starts every component that does not run (all of them on a fresh state folder). The node counts
        apply to a fresh folder only: a restarted node agent serves the nodes it served. No operator is started
        while one runs, also one started by hand."""
        if nodes < 0 or spot_nodes < 0 or nodes + spot_nodes == 0:
            raise ClusterError("--nodes and --spot-nodes must be >= 0 with at least one node in total")
        self.dir.mkdir(parents=True, exist_ok=True)
        missing = [n for n in COMPONENTS if not self.alive(n)]
        if "operator" in missing and (not operator or any(self.alive(n) for n in self.operators())):
            missing.remove("operator")
        if not missing:
            say(f"everything already runs from {self.dir}")
        elif any(self.alive(n) for n in self.components()):
            say(f"starting what does not run from {self.dir}: {', '.join(missing)}")
        started: list[str] = []
        try:
            for name in missing:
                self._start(name, timeout, say, nodes=nodes, spot_nodes=spot_nodes)
                started.append(name)
        except BaseException:
            self.down(say=lambda *_: None, only=started)
            raise
        say(f"kubeconfig  {self.kubeconfig}")
        say(f"export KUBECONFIG={self.kubeconfig}")
        return self.kubeconfig

    def _start(
        self,
        name: str,
        timeout: float,
        say,
        nodes: int = 1,
        spot_nodes: int = 2,
        previous: dict | None = None,
    ) -> int:
        """Starts one component (the command line of its last run when it has one) and waits until it is ready."""
        previous = previous or self._record(name) or {}
        if name == "apiserver":
            port = previous.get("port")
            others = [n for n in self.components() if n != "apiserver" and self.alive(n)]
            if not port or (not others and not port_free(port)):
                port = free_port()  # the others talk to the recorded port: they keep it
            argv = [sys.executable, "-m", "ftjob_local.apiserver", "--state-dir", str(self.dir)]
            proc = self._spawn(name, [*argv, "--port", str(port)], {"port": port})
            server = f"http://127.0.0.1:{port}"
            self._wait(name, proc, lambda: _http_ok(f"{server}/version"), timeout)
            write_kubeconfig(self.kubeconfig, server)
            say(f"API server  {server} (pid {proc.pid})")
        elif name in ("proxy", "node-agent"):
            ready_file = self.dir / name / "ready"
            ready_file.unlink(missing_ok=True)
            module = "ftjob_local.netproxy" if name == "proxy" else "ftjob_local.node"
            argv = [
                sys.executable,
                "-m",
                module,
                "--kubeconfig",
                str(self.kubeconfig),
                "--state-dir",
                str(self.dir),
            ]
            if name == "node-agent":
                argv += ["--nodes", str(nodes), "--spot-nodes", str(spot_nodes)]
            proc = self._spawn(name, previous.get("argv") or argv)
            self._wait(name, proc, ready_file.exists, timeout)
            if name == "proxy":
                say(f"proxy       Service addresses 127.96.0.0/16 (pid {proc.pid})")
            else:
                served = json.loads(ready_file.read_text()).get("nodes", [])
                say(f"node agent  nodes {', '.join(served)} (pid {proc.pid})")
        else:
            proc = self._start_operator(name, previous, timeout, say)
        return proc.pid

    def _start_operator(self, name: str, previous: dict, timeout: float, say) -> subprocess.Popen:
        if importlib.util.find_spec("ftjob_operator.handlers") is None:
            raise ClusterError("the operator (ftjob_operator.handlers) is not part of this build")
        metrics = previous.get("metricsPort") or _metrics_port(previous.get("argv") or [])
        if not metrics or not port_free(metrics):
            metrics = free_port()
        argv = [sys.executable, "-m", "ftjob_operator.cli", "operator", "--kubeconfig", str(self.kubeconfig)]
        if previous.get("argv"):  # a restart, of this one or of one started by hand: the same flags
            argv = _with_metrics_port(previous["argv"], metrics)
        else:
            argv += ["--metrics-port", str(metrics)]
        # One started by hand and restarted here is a component like the others (own process group, log here),
        # with the environment it had; ours derives the jobs' tokens from the state folder's key (tokens.py).
        env = previous.get("env") or {TOKEN_KEY_ENV: self._token_key()}
        proc = self._spawn(
            name,
            argv,
            {"metricsPort": metrics, "env": env},
            cwd=Path(previous["cwd"]) if previous.get("cwd") else None,
            env=env,
        )
        # Ready = its metrics endpoint answers (served once the operator runs); a process alive after the
        # timeout is reported as running anyway, since metrics are optional to the operator.
        try:
            self._wait(name, proc, lambda: _http_ok(f"http://127.0.0.1:{metrics}/metrics"), min(timeout, 20))
        except ClusterError:
            if proc.poll() is not None:
                raise
            say(
                f"warning: operator metrics on :{metrics} did not answer; see {self.log_dir / (name + '.log')}"
            )
        say(f"{name:11} metrics http://127.0.0.1:{metrics}/metrics (pid {proc.pid})")
        return proc

    def _token_key(self) -> str:
        """The key this folder's operator derives job tokens from (created once, readable by its owner only)."""
        path = self.dir / "operator-token-key"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(secrets.token_hex(32))
            tmp.chmod(0o600)
            tmp.replace(path)
        return path.read_text().strip()

    # --- restart -------------------------------------------------------------------------------------------------
    def restart(self, name: str, timeout: float = 60.0, say=print) -> dict[str, int]:
        """Stops the components asked for (apiserver, proxy, kubelet, operator: every operator of the folder,
        those started by hand included; all: every component) and starts them again with the same command line;
        pods keep running throughout. Returns the new pids once each is ready again."""
        if name not in RESTARTABLE and name not in COMPONENTS:
            raise ClusterError(f"unknown component {name!r} (one of {', '.join(RESTARTABLE)})")
        wanted = {"all": self.components(), "operator": self.operators()}.get(name, [ALIASES.get(name, name)])
        known = [n for n in wanted if self._record(n) is not None]
        if not known:
            raise ClusterError(
                f"{name} was never started from {self.dir}: start the cluster with "
                f"ftjob local up --state-dir {self.dir}"
            )
        pids = {}
        for n in known:
            previous = self._record(n)  # read first: an operator started by hand removes its record on exit
            if self.alive(n):
                _stop(previous, timeout)
                say(f"stopped {n} (pid {previous['pid']})")
            pids[n] = self._start(n, timeout, say, previous=previous)
        return pids

    # --- down --------------------------------------------------------------------------------------------------------
    def down(self, timeout: float = 30.0, say=print, only: list[str] | None = None) -> list[str]:
        """Stops the components (only: those named), newest layer first; without only, also every pod process."""
        stopped = []
        for name in reversed(self.components()):
            if only is not None and name not in only and ALIASES.get(name, name) not in only:
                continue
            rec = self.alive(name)
            if rec:
                _stop(rec, timeout)
                stopped.append(name)
                say(f"stopped {name} (pid {rec['pid']})")
        if only is None:  # pods outlive the node agent: sweep what it recorded
            for stale in records.hand_started(self.dir):
                (self.run_dir / f"{stale}.json").unlink(missing_ok=True)
            pid_files = list((self.dir / "pods").glob("*/containers/*/pid"))
            swept = sum(kill_recorded(f) for f in pid_files)
            if swept:
                say(f"killed {swept} leftover pod process group(s)")
                # SIGKILL is delivered asynchronously: return once they are gone, as _stop does for components
                deadline = time.monotonic() + timeout
                while any(recorded_alive(f) for f in pid_files) and time.monotonic() < deadline:
                    time.sleep(0.05)
            if not stopped:
                say(f"nothing was running from {self.dir}")
        return stopped

    # --- status ------------------------------------------------------------------------------------------------------
    def status(self) -> dict:
        out: dict = {"stateDir": str(self.dir), "kubeconfig": str(self.kubeconfig), "components": {}}
        for name in self.components():
            rec = self.alive(name)
            if name not in COMPONENTS and not rec:
                continue  # an operator started by hand shows while it runs
            out["components"][name] = {
                "running": bool(rec),
                **({"pid": rec["pid"]} if rec else {}),
                **({"port": rec["port"]} if rec and rec.get("port") else {}),
                **({"metricsPort": rec["metricsPort"]} if rec and rec.get("metricsPort") else {}),
                **({"handStarted": True} if rec and rec.get("handStarted") else {}),
            }
        if out["components"]["apiserver"]["running"] and self.kubeconfig.exists():
            try:
                from .client import Kube
                from .objects import SPOT_LABEL, condition

                kube = Kube(str(self.kubeconfig))
                nodes = kube.request("GET", "/api/v1/nodes", timeout=5).get("items") or []
                out["nodes"] = [
                    {
                        "name": n["metadata"]["name"],
                        "ready": (condition(n, "Ready") or {}).get("status") == "True",
                        "spot": (n["metadata"].get("labels") or {}).get(SPOT_LABEL) == "true",
                        "taints": [t.get("key") for t in (n.get("spec") or {}).get("taints") or []],
                    }
                    for n in nodes
                ]
                pods = kube.request("GET", "/api/v1/pods", timeout=5).get("items") or []
                phases: dict[str, int] = {}
                for p in pods:
                    ph = (p.get("status") or {}).get("phase") or "Pending"
                    phases[ph] = phases.get(ph, 0) + 1
                out["pods"] = phases
            except Exception as e:
                out["apiError"] = str(e)
        return out


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except Exception:
        return False


def _metrics_port(argv: list[str]) -> int | None:
    for i, a in enumerate(argv):
        if a == "--metrics-port" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1]) or None
        if a.startswith("--metrics-port=") and a.split("=", 1)[1].isdigit():
            return int(a.split("=", 1)[1]) or None
    return None


def _with_metrics_port(argv: list[str], port: int) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--metrics-port":
            skip = True
        elif not a.startswith("--metrics-port="):
            out.append(a)
    return [*out, "--metrics-port", str(port)]


def _stop(rec: dict, timeout: float) -> None:
    """SIGTERM the component (its process group, unless it was started by hand and leads none), SIGKILL it after
    timeout, and wait until the process is gone."""
    pid, start = int(rec["pid"]), rec.get("start", "")
    group = not rec.get("handStarted")

    def send(sig: int) -> None:
        try:
            os.killpg(pid, sig) if group else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running(pid, start):
        if time.monotonic() > deadline:
            send(signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.05)
    if group:  # anything left in the group (children of a crashed parent) goes too
        send(signal.SIGKILL)
