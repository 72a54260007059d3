"""A container as the kubelet tracks it (Ctr), and the text rules applied to its spec: $(VAR) and mount paths."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ftjob_trainer.contract import DEFAULT_TERMINATION_LOG

from ..client import Obj
from ..procs import ContainerProcess

HOST_IP = "127.0.0.1"
DEFAULT_TERMINATION_PATH = DEFAULT_TERMINATION_LOG  # a container's terminationMessagePath when it sets none
ENV_MOUNTS = "FTJOB_LOCAL_MOUNTS"  # JSON {mountPath: backing folder} in every container's environment
BACKOFF_START, BACKOFF_MAX = (
    1.0,
    30.0,
)  # restart backoff (Kubernetes: 10 s doubling to 300 s), short for local use


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
    proc: ContainerProcess | None = None  # its shim, started here or adopted after a kubelet restart
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
