"""`ftjob operator` (kopf) as a child process of a test: start until /healthz answers, HTTP, metrics, log, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from ftjob_local.cluster import free_port

from .wait import wait_until


class OperatorProcess:
    """`python -m ftjob_operator operator --kubeconfig K ARGS --metrics-port P` in its own process group (a crash
    can then SIGKILL all of it); its output goes to log_path. Each start takes a free metrics (and /healthz) port."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.kubeconfig, self.log_path = kubeconfig, log_path
        self.args, self.env, self.cwd = list(args), env, cwd
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self, timeout: float = 60) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "ftjob_operator", "operator", "--kubeconfig", str(self.kubeconfig),
                *self.args, "--metrics-port", str(self.port)]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env if self.env is not None else dict(os.environ),
                cwd=self.cwd,
            )
        wait_until(lambda: self.healthz() == "ok", timeout, "the operator's /healthz", diagnose=self.log_tail)

    def http(self, path: str) -> str | None:
        """The body of GET path on the metrics port, None while it does not answer; fails if the operator exited."""
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(
                f"the operator exited ({self.proc and self.proc.returncode}):\n{self.log_tail()}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as resp:
                return resp.read().decode()
        except OSError:
            return None

    def healthz(self) -> str | None:
        return self.http("/healthz")

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample from /metrics, or None if it is not there."""
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.http("/metrics") or ""):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        return None

    def crash(self) -> None:
        """SIGKILL: the operator stops at whatever instruction it was on."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the operator's log, headed "operator log:" (what a failing test prints)."""
        text = self.log()
        return "operator log:\n" + ("\n".join(text.splitlines()[-lines:]) if text else "(no operator log)")
