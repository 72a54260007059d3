"""The container shim: what the local kubelet starts for each container, as a runtime's shim (containerd-shim,
conmon) is. It runs the container's argv as its child and writes the exit status to a file, so the status is not
lost when the kubelet that started the container restarts meanwhile (a process's exit code only reaches its
parent). Stdlib only, run by path with `python -I`: it starts in milliseconds and imports nothing of ftjob.

    python -I shim.py EXIT_FILE ARGV...

The shim leads the container's process group: the kubelet signals the group, the container's program gets the
signal, the shim ignores it and waits. EXIT_FILE gets the child's status as subprocess reports it (negative: killed
by that signal), written atomically; the shim then ends the same way as its child.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

# Signals the group may get that would end the shim before its child (SIGKILL ends both, which the kubelet
# knows: it sent it). A Python handler, not SIG_IGN: handlers are reset by exec, an ignored signal stays ignored.
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
START_FAILED = (
    127  # the child could not be executed (the kubelet checks the executable before, so this is rare)
)


def write_status(exit_file: Path, code: int) -> None:
    tmp = exit_file.with_name(exit_file.name + ".tmp")
    tmp.write_text(str(code))
    tmp.replace(exit_file)


def read_status(exit_file: Path) -> int | None:
    """The status a shim wrote, or None when it wrote none (still running, or killed itself)."""
    try:
        return int(exit_file.read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    exit_file, cmd = Path(argv[0]), argv[1:]
    for sig in PASSED_ON:
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        print(f"ftjob local shim: cannot run {cmd[0]!r}: {e}", file=sys.stderr, flush=True)
        write_status(exit_file, START_FAILED)
        return START_FAILED
    code = child.wait()
    write_status(exit_file, code)
    if code < 0:  # end as the child did, so a parent that waits for the shim reads the same status
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
