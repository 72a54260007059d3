"""The local API server alone (no node agent, no operator) with the real kubectl, the CRD applied: fast enough
for a module-scoped fixture, and all that admission needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")

Kubectl = Callable[..., subprocess.CompletedProcess]


def _kubeconfig(url: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": url}}],
        "users": [{"name": "me", "user": {}}],
        "contexts": [
            {"name": "local", "context": {"cluster": "local", "user": "me", "namespace": "default"}}
        ],
        "current-context": "local",
    }


@contextmanager
def apiserver_with_crd(workdir: Path) -> Iterator[Kubectl]:
    """Start `python -m ftjob_local.apiserver` under workdir, apply crds/, yield a kubectl(*args, check=,
    stdin=) runner; the server is stopped on exit whatever happened."""
    if KUBECTL is None:
        raise RuntimeError("kubectl is missing: run ./dev setup (it puts kubectl into .venv/bin)")
    state = workdir / "state"
    log_path = workdir / "apiserver.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftjob_local.apiserver", "--state-dir", str(state), "--port", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url_file = state / "apiserver.url"
        deadline = time.monotonic() + 30
        while not url_file.is_file() or not url_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the local API server did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(json.dumps(_kubeconfig(url_file.read_text().strip())))
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

        def kubectl(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
            out = subprocess.run(
                [KUBECTL, *args], env=env, capture_output=True, text=True, timeout=60, input=stdin
            )
            if check and out.returncode != 0:
                raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr}")
            return out

        kubectl("apply", "-f", str(ROOT / "crds"))
        kubectl("wait", "--for=condition=Established", "crd/trainingjobs.ftjob.dev", "--timeout=30s")
        yield kubectl
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
