"""Process-tree helpers of the local kubelet, stdlib only (the trainer's tests use them on machines without the
kubernetes client): find and signal a container's processes, including those that left its process group."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def _cpu_start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def descendants(pid: int) -> list[int]:
    """Every process below pid (children first found, then theirs), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo += children.get(child, [])
    return out


def kill_tree(pid: int, sig: int) -> None:
    """Signals pid's process group and, for SIGKILL, every descendant too: programs such as torchrun start their
    workers in sessions of their own, which a killed container must not leave running (a real kubelet kills the
    whole cgroup). The descendants are listed first: once their parent is dead they are reparented out of reach."""
    below = descendants(pid) if sig == signal.SIGKILL else []
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for child in below:
        try:
            os.kill(child, sig)
        except (ProcessLookupError, PermissionError):
            pass


# Every container process gets this variable with a value of its own; children inherit it, so a container's
# processes can be found after they left its process group and lost their parent (torchrun's workers run in
# sessions of their own and are reparented when torchrun dies first; a real kubelet kills the whole cgroup).
MARKER_ENV = "FTJOB_LOCAL_CONTAINER"


def marked(marker: str) -> list[int]:
    """The processes whose environment carries MARKER_ENV=marker (read from /proc)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    out = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                out.append(int(environ.parent.name))
        except (OSError, ValueError):
            continue
    return out


def kill_marked(marker: str) -> int:
    """SIGKILLs every process of the container that marker names; returns how many were signalled."""
    n = 0
    for pid in marked(marker) if marker else []:
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except (ProcessLookupError, PermissionError):
            pass
    return n


def kill_recorded(pid_file: Path, sig: int = signal.SIGKILL) -> bool:
    """Signals the process group recorded in pid_file if that very process still runs (pid reuse safe); for
    SIGKILL also every process left with the container's marker (its main process may be gone already)."""
    try:
        pid, started, *rest = pid_file.read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        return False
    hit = False
    if _cpu_start_time(pid) == started:
        kill_tree(pid, sig)
        hit = True
    if sig == signal.SIGKILL and rest and kill_marked(rest[0]):
        hit = True
    return hit
