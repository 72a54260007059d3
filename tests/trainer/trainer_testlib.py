"""Helpers for the trainer tests: run the real trainer under the real torchrun, watch its report, clean up."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ftjob_local.procs import kill_tree as kubelet_kill_tree
from support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The tiny model, short sequences: a step takes tens of milliseconds on a CPU.
TINY = [
    "--model",
    "tiny",
    "--seq-len",
    "32",
    "--global-batch-size",
    "4",
    "--log-every",
    "1",
    "--warmup-steps",
    "2",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal pid's process group and, for SIGKILL, every descendant: torchrun starts its workers in sessions of
    their own, so a process-group kill of the agent alone would orphan them. The local kubelet's helper."""
    kubelet_kill_tree(pid, sig)


class Procs:
    """Every process a test starts, each in its own session, so cleanup can kill its whole tree by id."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], *, name: str, env: dict | None = None) -> subprocess.Popen:
        full_env = dict(os.environ)
        full_env["PATH"] = f"{BIN}:{full_env.get('PATH', '')}"
        full_env["PYTHONPATH"] = f"{REPO}:{REPO / 'trainer_image'}"
        full_env["OMP_NUM_THREADS"] = "1"  # two ranks on two cores
        full_env.update(env or {})
        log = open(self.tmp / f"{name}.log", "w")
        p = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True, cwd=REPO
        )
        p.log_path = self.tmp / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def torchrun(
        self,
        args: list[str],
        *,
        name: str,
        nproc: int = 2,
        env: dict | None = None,
        rdzv: list[str] | None = None,
        max_restarts: int = 0,
    ) -> subprocess.Popen:
        launcher = rdzv or ["--standalone"]
        argv = [
            str(BIN / "torchrun"),
            *launcher,
            f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}",
            "-m",
            "ftjob_trainer.train",
            *args,
        ]
        return self.start(argv, name=name, env=env)

    def launch(
        self,
        args: list[str],
        *,
        name: str,
        nproc: int = 2,
        env: dict | None = None,
        rdzv: list[str] | None = None,
        max_restarts: int = 0,
        program: list[str] | None = None,
    ) -> subprocess.Popen:
        """ftjob's launcher (ftjob_trainer.launch: torchrun's flags, warm workers), as the operator runs it."""
        argv = [
            sys.executable,
            "-m",
            "ftjob_trainer.launch",
            *(rdzv or ["--standalone"]),
            f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}",
            *(program or ["-m", "ftjob_trainer.train"]),
            *args,
        ]
        return self.start(argv, name=name, env=env)

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                kill_tree(p.pid)  # this process, its session and its workers' own sessions
                p.wait(timeout=30)


def log_of(p: subprocess.Popen) -> str:
    return Path(p.log_path).read_text()  # type: ignore[attr-defined]


def wait_for(pred, *, timeout: float, proc: subprocess.Popen | None = None, what: str = "condition"):
    """support.wait_until that fails early, with the process's log, if proc exits first."""

    def exited() -> str | None:
        return None if proc is None or proc.poll() is None else f"the process exited with {proc.returncode}"

    def log_tail() -> str:
        return log_of(proc)[-4000:] if proc is not None else ""

    return wait_until(pred, timeout, what, interval=0.05, diagnose=log_tail, give_up=exited)


def finish(p: subprocess.Popen, timeout: float = 120) -> int:
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"process did not exit within {timeout}s:\n{log_of(p)[-4000:]}")


def report_step(path: Path) -> int:
    doc = read_json(path)
    return doc["step"] if doc else -1


def start_coordinator(
    procs: Procs,
    token: str = "s3cret",
    name: str = "coordinator",
    *,
    host: str = "127.0.0.1",
    store_port: int = 0,
    control_port: int = 0,
) -> tuple[subprocess.Popen, dict]:
    """The real coordinator (port 0: free ports); returns the process and its first stdout line (the ports)."""
    p = procs.start(
        [
            sys.executable,
            "-m",
            "ftjob_trainer.coordinator",
            "--host",
            host,
            "--store-port",
            str(store_port),
            "--control-port",
            str(control_port),
        ],
        name=name,
        env={"FTJOB_TOKEN": token},
    )

    def ports():
        for line in log_of(p).splitlines():
            if line.startswith("{"):
                return json.loads(line)
        return None

    return p, wait_for(ports, timeout=60, proc=p, what="the coordinator's ports")


def http(method: str, url: str, token: str | None = None, body: dict | None = None) -> tuple[int, dict | str]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode())
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw, code = r.read().decode(), r.status
    except urllib.error.HTTPError as e:
        raw, code = e.read().decode(), e.code
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw


def list_steps(ckpt: Path) -> list[int]:
    """Committed checkpoint steps, oldest first (names as the trainer commits them)."""
    if not ckpt.is_dir():
        return []
    return sorted(
        int(n.name[5:]) for n in ckpt.iterdir() if n.name.startswith("step-") and (n / "ftjob.json").exists()
    )


def events_of(p: subprocess.Popen) -> list[dict]:
    """The structured events (contract.EVENT_*) in a process's log, in order."""
    from ftjob_trainer import contract

    return contract.parse_events(log_of(p).splitlines())


# `--model hf:DIR` configs of a few million parameters (written by the tests: no hub, no network).
HF_CONFIGS = {
    "llama": {
        "model_type": "llama",
        "vocab_size": 4096,
        "hidden_size": 128,
        "intermediate_size": 344,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
    # GPT-2 keeps its default dropout (0.1) and ties its output layer to the token embedding
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": 4096,
        "n_embd": 128,
        "n_layer": 4,
        "n_head": 4,
        "n_positions": 256,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
}


def write_hf_config(folder: Path, family: str) -> Path:
    """A transformers model directory holding only config.json; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(HF_CONFIGS[family], indent=1))
    return folder
