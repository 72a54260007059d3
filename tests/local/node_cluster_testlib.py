"""Helpers of the node agent tests against a local cluster (the fixtures live in conftest.py): kubectl, and
pods made, read and waited on through the API."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from ftjob_local.client import Kube

NS = "default"


PY = sys.executable


def kubectl(cluster, *args, check=True) -> subprocess.CompletedProcess:
    exe = Path(PY).parent / "kubectl"
    return subprocess.run(
        [str(exe), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def make_pod(kube: Kube, pod_name: str, command: list[str], **spec) -> dict:
    container = {"name": "main", "image": "python:3.12", "command": command}
    container.update(spec.pop("container", {}))
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "labels": spec.pop("labels", {})},
        "spec": {"restartPolicy": spec.pop("restartPolicy", "Never"), "containers": [container], **spec},
    }
    return kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)


def get_pod(kube: Kube, pod_name: str) -> dict | None:
    return kube.get(f"/api/v1/namespaces/{NS}/pods/{pod_name}")


def phase_is(kube: Kube, pod_name: str, *phases: str):
    def check():
        pod = get_pod(kube, pod_name)
        return pod if pod and (pod.get("status") or {}).get("phase") in phases else None

    return check


def events_for(kube: Kube, pod_name: str) -> list[dict]:
    items = kube.request("GET", f"/api/v1/namespaces/{NS}/events").get("items") or []
    return [e for e in items if (e.get("involvedObject") or {}).get("name") == pod_name]


def cond(pod: dict, ctype: str) -> dict:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})
