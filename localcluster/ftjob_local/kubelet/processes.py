"""A container's process: start (with its log and termination file), reap, restart with backoff, signal."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from ftjob_trainer.contract import now_rfc3339

from ..layout import log_path
from ..objects import post_event
from ..procs import MARKER_ENV, ContainerProcess, kill_marked, kill_tree
from .container import BACKOFF_MAX, BACKOFF_START, ConfigError, Ctr, expand, rewrite_paths
from .env import PodEnvironment


class PodProcesses(PodEnvironment):
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
                _check_executable(argv[0], c.env.get("PATH", ""), c.cwd)
                c.marker = f"{self.uid}/{c.name}/{os.urandom(4).hex()}"
                c.proc = ContainerProcess.spawn(
                    argv,
                    self._exit_file(c),
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
        self._follow(c)
        (self.dir / "containers" / c.name / "pid").write_text(f"{c.proc.pid} {c.proc.start} {c.marker}")
        c.started_at, c.started_mono = now_rfc3339(), time.monotonic()
        c.state = {"running": {"startedAt": c.started_at}}
        c.ready = False
        c.probe_next, c.probe_ok, c.probe_fail = {}, {}, {}
        post_event(
            self.k.kube, self.pod, "Started", f"Started container {c.name} (pid {c.proc.pid})", host=self.node
        )

    def _exit_file(self, c: Ctr) -> Path:
        return self.dir / "containers" / c.name / "exit"

    def _follow(self, c: Ctr) -> None:
        """Wakes the pod's loop when the container's shim exits."""
        proc = c.proc
        threading.Thread(
            target=lambda: (proc.wait(), self.wake.set()), name=f"wait-{proc.pid}", daemon=True
        ).start()

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

    # --- signals: the process tree, and what left it (found by the container's marker) on SIGKILL -----------------
    def _signal(self, c: Ctr, sig: int) -> None:
        if c.proc is not None:
            kill_tree(c.proc.pid, sig)
            if sig == signal.SIGKILL:
                kill_marked(c.marker)

    def _kill_all(self, sig: int) -> None:
        for c in self.inits + self.ctrs:
            self._signal(c, sig)


def _check_executable(program: str, path: str, cwd: str) -> None:
    """Raises the OSError exec would (the shim runs the program, so its own start cannot fail this way)."""
    if "/" not in program:
        if shutil.which(program, path=path) is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory in $PATH", program)
        return
    full = Path(cwd, program)
    if not full.is_file():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
    if not os.access(full, os.X_OK):
        raise PermissionError(errno.EACCES, "Permission denied", program)
