"""Starting and stopping the local cluster's processes: API server, node agent, operator.

Each runs in its own process group with its log in DIR/logs/<component>.log and a pid record in
DIR/run/<component>.json (pid plus the kernel's start time, so a reused pid is never signalled). `down` stops them
in reverse order and then sweeps any pod process the node agent recorded, so nothing is left running even when
the agent itself was killed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from .procs import _cpu_start_time, kill_recorded

COMPONENTS = ("apiserver", "node-agent", "operator")


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
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ftjob-local",
        "preferences": {},
        "clusters": [{"name": "ftjob-local", "cluster": {"server": server}}],
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
        self.run_dir = self.dir / "run"
        self.log_dir = self.dir / "logs"
        self.kubeconfig = self.dir / "kubeconfig"

    # --- pid records -----------------------------------------------------------------------------------------------
    def _record(self, name: str) -> dict | None:
        try:
            return json.loads((self.run_dir / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None

    def alive(self, name: str) -> dict | None:
        rec = self._record(name)
        if rec and _cpu_start_time(rec["pid"]) == rec.get("start") and _state(rec["pid"]) != "Z":
            return rec
        return None

    def _spawn(self, name: str, argv: list[str], extra: dict | None = None) -> subprocess.Popen:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.dir,
            )
        rec = {"pid": proc.pid, "start": _cpu_start_time(proc.pid), "argv": argv, **(extra or {})}
        (self.run_dir / f"{name}.json").write_text(json.dumps(rec))
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
        if nodes < 0 or spot_nodes < 0 or nodes + spot_nodes == 0:
            raise ClusterError("--nodes and --spot-nodes must be >= 0 with at least one node in total")
        running = [n for n in COMPONENTS if self.alive(n)]
        if running:
            raise ClusterError(
                f"a local cluster already runs from {self.dir} ({', '.join(running)}); "
                f"stop it first: ftjob local down --state-dir {self.dir}"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        started: list[str] = []
        try:
            previous = self._record("apiserver") or {}
            port = (
                previous.get("port") if previous.get("port") and port_free(previous["port"]) else free_port()
            )
            proc = self._spawn(
                "apiserver",
                [
                    sys.executable,
                    "-m",
                    "ftjob_local.apiserver",
                    "--state-dir",
                    str(self.dir),
                    "--port",
                    str(port),
                ],
                {"port": port},
            )
            started.append("apiserver")
            server = f"http://127.0.0.1:{port}"
            self._wait("apiserver", proc, lambda: _http_ok(f"{server}/version"), timeout)
            write_kubeconfig(self.kubeconfig, server)
            say(f"API server  {server} (pid {proc.pid})")

            ready_file = self.dir / "node-agent" / "ready"
            ready_file.unlink(missing_ok=True)
            proc = self._spawn(
                "node-agent",
                [
                    sys.executable,
                    "-m",
                    "ftjob_local.node",
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--state-dir",
                    str(self.dir),
                    "--nodes",
                    str(nodes),
                    "--spot-nodes",
                    str(spot_nodes),
                ],
            )
            started.append("node-agent")
            self._wait("node-agent", proc, ready_file.exists, timeout)
            served = json.loads(ready_file.read_text()).get("nodes", [])
            say(f"node agent  nodes {', '.join(served)} (pid {proc.pid})")

            if operator:
                self._start_operator(timeout, say, started)
        except BaseException:
            self.down(say=lambda *_: None, only=started)
            raise
        say(f"kubeconfig  {self.kubeconfig}")
        say(f"export KUBECONFIG={self.kubeconfig}")
        return self.kubeconfig

    def _start_operator(self, timeout: float, say, started: list[str]) -> None:
        if importlib.util.find_spec("ftjob_operator.handlers") is None:
            say("warning: the operator (ftjob_operator.handlers) is not part of this build yet: not started")
            return
        metrics = free_port()
        proc = self._spawn(
            "operator",
            [
                sys.executable,
                "-m",
                "ftjob_operator.cli",
                "operator",
                "--kubeconfig",
                str(self.kubeconfig),
                "--metrics-port",
                str(metrics),
            ],
            {"metricsPort": metrics},
        )
        started.append("operator")
        # Ready = its metrics endpoint answers (served once the operator runs); a process alive after the
        # timeout is reported as running anyway, since metrics are optional to the operator.
        try:
            self._wait(
                "operator", proc, lambda: _http_ok(f"http://127.0.0.1:{metrics}/metrics"), min(timeout, 20)
            )
        except ClusterError:
            if proc.poll() is not None:
                raise
            say(
                f"warning: operator metrics on :{metrics} did not answer; see {self.log_dir / 'operator.log'}"
            )
        say(f"operator    metrics http://127.0.0.1:{metrics}/metrics (pid {proc.pid})")

    def restart(self, name: str, timeout: float = 60.0) -> int:
        """Stops one component and starts it again with the same command line (for control-plane / operator /
        node-agent restart tests); returns the new pid once it is ready again."""
        rec = self._record(name)
        if name not in COMPONENTS or rec is None:
            raise ClusterError(
                f"{name} was never started from {self.dir} (components: {', '.join(COMPONENTS)})"
            )
        if self.alive(name):
            _stop_group(rec["pid"], rec["start"], timeout)
        extra = {k: v for k, v in rec.items() if k not in ("pid", "start", "argv")}
        if name == "node-agent":
            (self.dir / "node-agent" / "ready").unlink(missing_ok=True)
        proc = self._spawn(name, rec["argv"], extra)
        ready = {
            "apiserver": lambda: _http_ok(f"http://127.0.0.1:{rec['port']}/version"),
            "node-agent": (self.dir / "node-agent" / "ready").exists,
            "operator": lambda: (
                proc.poll() is None
                and (not rec.get("metricsPort") or _http_ok(f"http://127.0.0.1:{rec['metricsPort']}/metrics"))
            ),
        }[name]
        self._wait(name, proc, ready, timeout)
        return proc.pid

    # --- down --------------------------------------------------------------------------------------------------------
    def down(self, timeout: float = 30.0, say=print, only: list[str] | None = None) -> list[str]:
        stopped = []
        for name in reversed(COMPONENTS):
            if only is not None and name not in only:
                continue
            rec = self.alive(name)
            if rec:
                _stop_group(rec["pid"], rec["start"], timeout)
                stopped.append(name)
                say(f"stopped {name} (pid {rec['pid']})")
        swept = 0
        if only is None or "node-agent" in only:  # pod processes belong to the node agent: only then
            for pid_file in (self.dir / "pods").glob("*/containers/*/pid"):
                if kill_recorded(pid_file):
                    swept += 1
        if swept:
            say(f"killed {swept} leftover pod process group(s)")
        if only is None and not stopped:
            say(f"nothing was running from {self.dir}")
        return stopped

    # --- status ------------------------------------------------------------------------------------------------------
    def status(self) -> dict:
        out: dict = {"stateDir": str(self.dir), "kubeconfig": str(self.kubeconfig), "components": {}}
        for name in COMPONENTS:
            rec = self.alive(name)
            out["components"][name] = {
                "running": bool(rec),
                **({"pid": rec["pid"]} if rec else {}),
                **({"port": rec["port"]} if rec and rec.get("port") else {}),
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


def _stop_group(pid: int, start: str, timeout: float) -> None:
    """SIGTERM the process group, SIGKILL it after timeout, and wait until the process is gone."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _cpu_start_time(pid) == start and _state(pid) != "Z":
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 10
        time.sleep(0.05)
    # Anything left in the group (children of a crashed parent) goes too.
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
