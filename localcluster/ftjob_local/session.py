"""A session with one local cluster: its kubeconfig, kubectl and API, with the calls the demo, the end-to-end
tests and the benches share (install the CRD, read a job, its pods, the namespace's events)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

from ftjob_trainer.contract import parse_time

from .client import ApiError, Kube
from .cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
GROUP_PATH = "/apis/ftjob.dev/v1alpha1"


class SessionError(Exception):
    """A kubectl call or the CRD install failed; the message says what to look at."""


def find_kubectl() -> str:
    here = Path(sys.executable).parent / "kubectl"
    found = str(here) if here.exists() else shutil.which("kubectl")
    if not found:
        raise SessionError(
            "kubectl not found next to this Python or on PATH; run ./dev setup (it installs kubectl "
            "into .venv/bin)"
        )
    return found


class Session:
    """A kubeconfig, kubectl and the API of one local cluster, with the calls the demo, tests and benches share."""

    def __init__(self, cluster: LocalCluster, namespace: str = "default"):
        self.cluster = cluster
        self.ns = namespace
        self.kube = Kube(str(cluster.kubeconfig))
        self.kubectl_bin = find_kubectl()

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        env = {
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "PATH": str(Path(self.kubectl_bin).parent),
            "HOME": str(self.cluster.dir),
        }
        p = subprocess.run(
            [self.kubectl_bin, *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and p.returncode != 0:
            raise SessionError(
                f"kubectl {' '.join(args)} failed ({p.returncode}): {p.stderr.strip() or p.stdout}"
            )
        return p

    def install_crd(self, timeout: float = 30) -> None:
        self.kubectl("apply", "-f", str(CRD_DIR))
        deadline = time.monotonic() + timeout
        while True:  # served once the API server has picked the CRD up
            try:
                self.kube.request("GET", f"{GROUP_PATH}/trainingjobs")
                return
            except ApiError as e:
                if time.monotonic() > deadline:
                    raise SessionError(
                        f"the TrainingJob resource was not served {timeout:g}s after applying {CRD_DIR}: {e}"
                    ) from None
            time.sleep(0.2)

    def job_path(self, name: str) -> str:
        return f"{GROUP_PATH}/namespaces/{self.ns}/trainingjobs/{name}"

    def job(self, name: str) -> dict | None:
        return self.kube.get(self.job_path(name))

    def pods(self, job: str) -> list[dict]:
        q = {"labelSelector": f"ftjob.dev/job-name={job}"}
        return self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/pods", query=q).get("items") or []

    def events(self) -> list[dict]:
        return self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/events").get("items") or []

    def node_of_worker(self, job: str, among: Collection[str] | None = None) -> str | None:
        """The node of the oldest running worker (a spot node in the examples), of the pods `among` if given (those
        training, say, and not a warm spare)."""
        running = [
            p
            for p in self.pods(job)
            if (p["metadata"].get("labels") or {}).get("ftjob.dev/role") == "worker"
            and (among is None or p["metadata"]["name"] in among)
            and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        running.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
        return running[0]["spec"].get("nodeName") if running else None


def event_time(ev: dict) -> float | None:
    """When a Kubernetes Event happened (unix seconds), from the first of its time fields that is set."""
    for value in (ev.get("eventTime"), ev.get("lastTimestamp"), ev.get("firstTimestamp")):
        if value:
            return parse_time(value).timestamp()
    created = parse_time((ev.get("metadata") or {}).get("creationTimestamp"))
    return created.timestamp() if created else None
