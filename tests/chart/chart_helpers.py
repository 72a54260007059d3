"""Shared helpers for the chart and image tests: the real helm binary, rendered manifests, fresh venvs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ftjob"
VENV_BIN = Path(sys.executable).parent
TORCH_VERSION = "2.13.0"  # the CPU wheel ./dev installs; PIP_FIND_LINKS=/opt/wheels holds it on CI machines
# What the chart renders for these scenarios; the namespaced one is what a locked-down cluster would use.
HA_NAMESPACED = {
    "replicaCount": "2",
    "peering.enabled": "true",
    "metrics.serviceMonitor.enabled": "true",
    "watchNamespaces": "{team-a,team-b}",
}


def tool(name: str) -> str:
    """A binary from the project's venv (tools/fetch_k8s_tools.py puts helm there), else from PATH."""
    found = VENV_BIN / name
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` not found in {VENV_BIN} or PATH: run ./dev setup (tools/fetch_k8s_tools.py installs it)"
        )
    return path


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def set_args(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def render(
    values: dict[str, str] | None = None, *, namespace: str = "ftjob-system", crds: bool = False
) -> list[dict]:
    """`helm template` the chart and return its documents (empty ones dropped)."""
    args = ["template", "t", str(CHART), "--namespace", namespace, *set_args(values or {})]
    if crds:
        args.append("--include-crds")
    docs = yaml.safe_load_all(helm(*args).stdout)
    return [d for d in docs if d]


def find(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
    return [
        d
        for d in docs
        if d["kind"] == kind
        and (name is None or d["metadata"]["name"] == name)
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]


def one(docs: list[dict], kind: str, **kw: str) -> dict:
    found = find(docs, kind, **kw)
    assert len(found) == 1, (
        f"expected one {kind} {kw}, got {len(found)}: {[d['metadata']['name'] for d in found]}"
    )
    return found[0]


# --- fresh virtual environments (the images' installs and each extra alone) ----------------------------------------


def torch_wheel_here() -> bool:
    """pip can take torch from local disk (CI's network reaches package registries, not download.pytorch.org)."""
    return any(Path("/opt/wheels").glob(f"torch-{TORCH_VERSION}*.whl")) or "PIP_FIND_LINKS" in os.environ


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def base_env(python_bin: Path) -> dict[str, str]:
    """The environment of the image's shell: its python first on PATH, nothing from the project's venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = f"{python_bin.parent}:/usr/bin:/bin"
    return env


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(python: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return {canonical(p["name"]): p["version"] for p in json.loads(out)}
