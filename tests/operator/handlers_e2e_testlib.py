"""Helpers of the operator end-to-end tests (test_handlers_e2e_*.py, test_handlers_peering.py; the fixtures live
in conftest.py): the stand-in trainer, the operator process as the chart runs it, and `Env`, which creates jobs,
reads them and their pods, and waits on them.

Workers run a stand-in trainer (FAKE_TRAINER below) under the real torchrun, rendezvousing at the real
coordinator: it speaks the coordinator's control API (progress, checkpoint requests) and behaves as the test asks
(finish, crash, keep training until SIGTERM), so each test is about the operator and takes seconds. Every wait
polls a condition with a timeout and prints the job, its pods and the operator's log when it gives up.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftjob_local.client import ApiError, Kube
from ftjob_local.cluster import LocalCluster
from ftjob_operator import render
from support.operator_process import OperatorProcess
from support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]


NS = "default"


DEFAULT_IMAGE = "ftjob-trainer:operator-default"  # what the chart sets from trainer.image


JOBS = f"/apis/ftjob.dev/v1alpha1/namespaces/{NS}/trainingjobs"


PODS = f"/api/v1/namespaces/{NS}/pods"


# A stand-in for ftjob_trainer.train (stdlib only). Modes:
#   done   report a step, write the "done" termination message, exit 0
#   crash  write an "error" termination message, then end its torchrun agent (its parent: FTJOB_WARM_WORKERS=0) with
#          SIGKILL: torchrun restarts a failing worker itself (--max-restarts is large), so a pod only fails when
#          the agent does
#   serve  report progress twice a second, answer checkpoint requests with a "committed" checkpoint, and on
#          SIGTERM take $FAKE_SAVE_SECONDS (as a save would) then exit 75 ("checkpointed, restart me")
FAKE_TRAINER = r"""
import json, os, signal, sys, time, urllib.request
from datetime import datetime, timezone

SAVE_SECONDS = float(os.environ.get("FAKE_SAVE_SECONDS", "2"))
mode = sys.argv[1]
url, token = os.environ["FTJOB_COORDINATOR_URL"], os.environ["FTJOB_TOKEN"]
rank0 = os.environ.get("GROUP_RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"

def now():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

def call(method, route, body=None):
    req = urllib.request.Request(url + route, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())

def finish(reason, code, message, step=None):
    with open(os.environ["FTJOB_TERMINATION_LOG"], "w") as f:
        json.dump({"step": step, "checkpoint": None, "reason": reason, "exitCode": code, "message": message}, f)
    print(f"fake trainer: {reason} ({message}), exit {code}", flush=True)
    sys.exit(code)

if mode == "done":
    if rank0:
        call("POST", "/v1/progress", {"step": 5})
    finish("done", 0, "finished", 5)
if mode == "crash":
    with open(os.environ["FTJOB_TERMINATION_LOG"], "w") as f:
        json.dump({"step": None, "checkpoint": None, "reason": "error", "exitCode": 3,
                   "message": "fake trainer crashed on purpose"}, f)
    print("fake trainer: crashing on purpose", flush=True)
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(3)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
step, handled = 0, 0
while not stop:
    step += 1
    if rank0:
        body = {"step": step}
        try:
            request = call("GET", "/v1/progress").get("checkpointRequest") or {}
            if request.get("id", 0) > handled:
                handled = request["id"]
                body.update(lastCheckpoint={"step": step, "path": f"/checkpoints/step-{step}", "time": now()},
                            handledRequestId=handled)
                print(f"fake trainer: checkpoint at step {step} for {request.get('reason')}", flush=True)
            call("POST", "/v1/progress", body)
        except OSError as e:
            print(f"fake trainer: coordinator not reachable: {e}", flush=True)
    time.sleep(0.5)
time.sleep(SAVE_SECONDS)
finish("preempted", 75, "stopped by SIGTERM after a save", step)
"""


def make_operator(kubeconfig: Path, log_path: Path, peering: str | None = None) -> OperatorProcess:
    """`ftjob operator` as the chart runs it, with the default trainer image the chart sets."""
    return OperatorProcess(
        kubeconfig,
        log_path,
        args=["--log-level", "INFO", *(["--peering", peering] if peering else [])],
        env={**os.environ, "FTJOB_DEFAULT_TRAINER_IMAGE": DEFAULT_IMAGE},
    )


class Env:
    def __init__(self, cluster: LocalCluster, operator: OperatorProcess, fake: Path):
        self.cluster, self.operator, self.fake = cluster, operator, fake
        self.kube = Kube(str(cluster.kubeconfig))
        self.created: list[str] = []

    def job(self, name: str) -> dict[str, Any]:
        obj = self.kube.get(f"{JOBS}/{name}")
        assert obj is not None, f"TrainingJob {name} is gone"
        return obj

    def status(self, name: str) -> dict[str, Any]:
        return self.job(name).get("status") or {}

    def pods(self, name: str, role: str | None = None) -> list[dict[str, Any]]:
        selector = f"{render.LABEL_JOB_NAME}={name}" + (f",{render.LABEL_ROLE}={role}" if role else "")
        return self.kube.request("GET", PODS, query={"labelSelector": selector}).get("items") or []

    def live_workers(self, name: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(name, render.ROLE_WORKER)
            if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.kube.request("GET", f"/api/v1/namespaces/{NS}/events").get("items") or []
        return [e for e in items if (e.get("involvedObject") or {}).get("name") == name]

    def reasons(self, name: str) -> list[str]:
        return [e.get("reason") for e in self.events(name)]

    def create_job(self, name: str, mode: str, **spec: Any) -> dict[str, Any]:
        workers = spec.pop("workers", 1)
        body = {
            "apiVersion": "ftjob.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name},
            "spec": {
                "image": "ftjob-trainer:dev",
                "command": [str(self.fake)],
                "args": [mode],
                "workers": {"min": 1, "max": workers},
                "checkpoint": {"volume": {"emptyDir": {}}},
                "preemption": {"gracePeriodSeconds": 10},
                "rendezvous": {"lastCallTimeoutSeconds": 1, "joinTimeoutSeconds": 120},
                "scheduling": {
                    "workers": {"nodeSelector": {"ftjob.dev/spot": "true"}},
                    "coordinator": {"nodeSelector": {"kubernetes.io/hostname": "local-node-0"}},
                },
                **spec,
            },
        }
        if body["spec"].get("image", "") is None:
            del body["spec"]["image"]
        self.created.append(name)
        return self.kube.request("POST", JOBS, body=body)

    def patch_job(self, name: str, patch: dict[str, Any]) -> None:
        self.kube.merge_patch(f"{JOBS}/{name}", patch)

    def coordinator_progress(self, name: str) -> dict[str, Any] | None:
        svc = self.kube.get(f"/api/v1/namespaces/{NS}/services/{render.service_name(name)}")
        secret = self.kube.get(f"/api/v1/namespaces/{NS}/secrets/{render.secret_name(name)}")
        if not svc or not secret:
            return None
        import base64

        token = base64.b64decode(secret["data"][render.TOKEN_KEY]).decode()
        req = urllib.request.Request(
            f"http://{svc['spec']['clusterIP']}:29401/v1/progress",
            headers={"Authorization": f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return json.loads(resp.read())
        except OSError:
            return None

    def diagnose(self, name: str | None = None) -> str:
        out = []
        if name:
            try:
                out.append(f"status: {json.dumps(self.status(name), indent=1)}")
                for p in self.pods(name):
                    st = p.get("status") or {}
                    out.append(
                        f"pod {p['metadata']['name']} phase={st.get('phase')} node={p['spec'].get('nodeName')} "
                        f"deleting={bool(p['metadata'].get('deletionTimestamp'))}"
                    )
                out.append(f"events: {self.reasons(name)}")
            except (ApiError, AssertionError, OSError) as e:
                out.append(f"(could not read the job: {e})")
        out.append(self.operator.log_tail())
        return "\n".join(out)

    def until(self, fn: Callable[[], Any], timeout: float, what: str, job: str | None = None) -> Any:
        return wait_until(fn, timeout, what, diagnose=lambda: self.diagnose(job))


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})
