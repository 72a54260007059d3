"""Process-tree helpers of the local kubelet, stdlib only (the trainer's tests use them on machines without the
kubernetes client): find and signal a container's processes, including those that left its process group, and
follow a container's shim whether this process started it or an earlier kubelet did."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from .shim import read_status

SHIM = Path(__file__).with_name("shim.py")


def _cpu_start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (R, S, Z, ...), or "" when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def running(pid: int, start: str) -> bool:
    """pid is the very process that started at start (not a reused pid) and has not exited (no zombie)."""
    return bool(start) and _cpu_start_time(pid) == start and process_state(pid) not in ("", "Z")


def shim_argv(exit_file: Path, argv: list[str]) -> list[str]:
    """The command line that runs argv under the container shim (ftjob_local/shim.py)."""
    return [sys.executable, "-I", str(SHIM), str(exit_file), *argv]


class ContainerProcess:
    """A container's shim, seen from the kubelet: `poll()` and `wait()` as subprocess.Popen has them.

    The kubelet that started it holds the Popen; a kubelet restarted since adopts it by pid and start time and
    reads its status from the exit file (the shim is not its child, so the kernel would not tell it the code)."""

    def __init__(self, pid: int, start: str, exit_file: Path, popen: subprocess.Popen | None = None):
        self.pid, self.start, self.exit_file, self.popen = pid, start, exit_file, popen
        self.returncode: int | None = None

    @classmethod
    def spawn(cls, argv: list[str], exit_file: Path, **popen_kwargs) -> ContainerProcess:
        exit_file.unlink(missing_ok=True)
        popen = subprocess.Popen(shim_argv(exit_file, argv), **popen_kwargs)
        return cls(popen.pid, _cpu_start_time(popen.pid), exit_file, popen)

    def poll(self) -> int | None:
        """None while it runs; then the container's status (negative: killed by that signal)."""
        if self.returncode is None:
            if self.popen is not None:
                own = self.popen.poll()
                if own is None:
                    return None
            elif running(self.pid, self.start):
                return None
            else:
                own = -signal.SIGKILL  # gone without a word: only a SIGKILL ends a shim so
            written = read_status(self.exit_file)
            self.returncode = written if written is not None else own
        return self.returncode

    def wait(self) -> int:
        if self.popen is not None:
            self.popen.wait()
        else:
            try:  # a pidfd becomes readable when the process exits (Linux 5.3+)
                fd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):
                fd = None
            if fd is not None:
                try:
                    while running(self.pid, self.start):
                        select.select([fd], [], [], 5.0)
                finally:
                    os.close(fd)
            while running(self.pid, self.start):
                time.sleep(0.5)
        return self.poll()  # type: ignore[return-value]


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


def recorded_alive(pid_file: Path) -> bool:
    """Whether the process recorded in pid_file, or any process left with its container's marker, still runs."""
    try:
        pid, started, *rest = pid_file.read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        return False
    return running(pid, started) or bool(
        rest and any(process_state(p) not in ("", "Z") for p in marked(rest[0]))
    )


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
