"""Which process runs each component of a local cluster: the run records of its state folder (DIR).

DIR/run/<name>.json holds a component's pid and the kernel's start time of that pid (a reused pid is never taken
for it), its command line and what it serves (port, metrics port). `ftjob local up` writes the records of what it
starts; an operator started by hand (`ftjob operator --kubeconfig K`, K a kubeconfig of the state folder) writes
DIR/run/operator-<pid>.json itself (`register_hand_started`), so `ftjob local status|down|restart` know it too.

A kubeconfig belongs to a state folder when its cluster entry carries the extension STATE_DIR_EXTENSION (written by
`ftjob local up`; copies of the file keep it), or when it lies in a state folder whose API server it names.
Stdlib and PyYAML only: the operator's command imports this module.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

import yaml

from .procs import _cpu_start_time, running

STATE_DIR_EXTENSION = "ftjob.dev/local-cluster"
MANAGED_ENV = "FTJOB_LOCAL_COMPONENT"  # set on what `ftjob local` starts: those never register themselves
HAND_STARTED_PREFIX = "operator-"


def run_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "run"


def read(state_dir: Path, name: str) -> dict | None:
    try:
        return json.loads((run_dir(state_dir) / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def write(state_dir: Path, name: str, record: dict) -> None:
    run_dir(state_dir).mkdir(parents=True, exist_ok=True)
    tmp = run_dir(state_dir) / f".{name}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.chmod(0o600)  # an operator's record holds its environment (the token key)
    tmp.replace(run_dir(state_dir) / f"{name}.json")


def alive(state_dir: Path, name: str) -> dict | None:
    """The record of name when its process still runs."""
    rec = read(state_dir, name)
    return rec if rec and running(int(rec["pid"]), rec.get("start", "")) else None


def hand_started(state_dir: Path) -> list[str]:
    """Names of the records of operators started by hand, running or not."""
    return sorted(f.stem for f in run_dir(state_dir).glob(f"{HAND_STARTED_PREFIX}*.json"))


def state_dir_of(kubeconfig: Path) -> Path | None:
    """The state folder a kubeconfig belongs to, or None."""
    try:
        doc = yaml.safe_load(kubeconfig.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    clusters = {
        c.get("name"): c.get("cluster") or {} for c in doc.get("clusters") or [] if isinstance(c, dict)
    }
    contexts = {
        c.get("name"): c.get("context") or {} for c in doc.get("contexts") or [] if isinstance(c, dict)
    }
    cluster = clusters.get((contexts.get(doc.get("current-context")) or {}).get("cluster"), {})
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") == STATE_DIR_EXTENSION:
            path = (ext.get("extension") or {}).get("stateDir")
            if path and (Path(path) / "run").is_dir():
                return Path(path)
    here = kubeconfig.resolve().parent
    server = urlparse(str(cluster.get("server") or ""))
    rec = read(here, "apiserver") or {}
    if server.hostname == "127.0.0.1" and rec.get("port") and server.port == rec["port"]:
        return here
    return None


def kubeconfig_path(explicit: str | None) -> Path:
    """The file a kubernetes client loads: the explicit one, else the first of $KUBECONFIG, else ~/.kube/config."""
    if explicit:
        return Path(explicit)
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return Path(env[0]) if env else Path.home() / ".kube" / "config"


def register_hand_started(
    kubeconfig: str | None, args: list[str], env: dict[str, str] | None = None
) -> Path | None:
    """Records this process (an operator run by hand with args, and env: the variables a restart needs) in the
    state folder its kubeconfig belongs to; the record goes when the process exits. Returns the record's path, or
    None when there is no such folder (a real cluster) or `ftjob local` started this process itself."""
    if os.environ.get(MANAGED_ENV):
        return None
    path = kubeconfig_path(kubeconfig)
    state = state_dir_of(path)
    if state is None:
        return None
    pid = os.getpid()
    # The command line of a restart: the same flags, with the kubeconfig as an absolute path.
    argv = [sys.executable, "-m", "ftjob_operator.cli", "operator", *_absolute_kubeconfig(args, path)]
    name = f"{HAND_STARTED_PREFIX}{pid}"
    write(
        state,
        name,
        {
            "pid": pid,
            "start": _cpu_start_time(pid),
            "argv": argv,
            "env": dict(env or {}),
            "handStarted": True,
            "cwd": os.getcwd(),
        },
    )
    record = run_dir(state) / f"{name}.json"
    atexit.register(record.unlink, missing_ok=True)
    return record


def _absolute_kubeconfig(args: list[str], path: Path) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "--kubeconfig" and i + 1 < len(args):
            skip = True
            continue
        if a.startswith("--kubeconfig="):
            continue
        out.append(a)
    return [*out, "--kubeconfig", str(path.resolve())]
