"""The real operator (`ftjob operator`, kopf, as a subprocess) against the real local cluster.

Workers run a stand-in trainer (FAKE_TRAINER below) under the real torchrun, rendezvousing at the real
coordinator: it speaks the coordinator's control API (progress, checkpoint requests) and behaves as the test asks
(finish, crash, keep training until SIGTERM), so each test is about the operator and takes seconds. Every wait
polls a condition with a timeout and prints the job, its pods and the operator's log when it gives up.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

from ftjob_local.client import ApiError, Kube  # noqa: E402
from ftjob_local.cluster import LocalCluster  # noqa: E402
from ftjob_local.preempt import request_preemption  # noqa: E402
from ftjob_local.session import find_kubectl  # noqa: E402
from ftjob_operator import render  # noqa: E402
from support.cluster import local_cluster  # noqa: E402
from support.operator_process import OperatorProcess  # noqa: E402
from support.wait import wait_until  # noqa: E402

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


# --- the cluster, the operator, and helpers ------------------------------------------------------------------
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


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("handlers")
    fake = root / "fake_trainer.py"
    fake.write_text(FAKE_TRAINER)
    with local_cluster(root / "cluster", nodes=1, spot_nodes=2) as cluster:
        operator = make_operator(cluster.kubeconfig, root / "operator.log")
        try:
            subprocess.run(
                [find_kubectl(), "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", str(REPO / "crds")],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            operator.start()
            yield Env(cluster, operator, fake)
        finally:
            operator.stop()


@pytest.fixture
def jobs(env):
    """Deletes the jobs a test created (their pods go with them), so the next test has the CPUs."""
    yield env
    for name in env.created:
        try:
            env.kube.request("DELETE", f"{JOBS}/{name}")
        except ApiError:
            pass
    env.created.clear()


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


# --- tests ---------------------------------------------------------------------------------------------------
def test_children_are_owned_and_labelled_workers_exiting_0_succeed_and_ttl_deletes(jobs):
    env, name = jobs, "done"
    job = env.create_job(name, "done", ttlSecondsAfterFinished=5, image=None)  # the operator's default image
    uid = job["metadata"]["uid"]
    pods = env.until(
        lambda: len(env.pods(name)) == 2 and env.pods(name), 30, "coordinator and worker pods", name
    )
    secret = env.kube.get(f"/api/v1/namespaces/{NS}/secrets/{render.secret_name(name)}")
    service = env.kube.get(f"/api/v1/namespaces/{NS}/services/{render.service_name(name)}")
    for obj in [secret, service, *pods]:
        assert obj is not None
        owner = obj["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "TrainingJob",
            name,
            uid,
            True,
        )
        labels = obj["metadata"]["labels"]
        assert labels[render.LABEL_JOB_NAME] == name and labels[render.LABEL_NAME] == "ftjob", labels
    roles = sorted(p["metadata"]["labels"][render.LABEL_ROLE] for p in pods)
    assert roles == ["coordinator", "worker"]
    assert all(p["metadata"]["labels"][render.LABEL_RESTART_GENERATION] == "0" for p in pods)
    assert service["spec"]["clusterIP"].startswith("127.96.")
    worker = next(p for p in pods if p["metadata"]["labels"][render.LABEL_ROLE] == "worker")
    env_vars = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env_vars[render.ENV_COORDINATOR_ADDR] == service["spec"]["clusterIP"]
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {DEFAULT_IMAGE}
    assert env.status(name)["image"] == DEFAULT_IMAGE

    st = env.until(
        lambda: env.status(name).get("phase") == "Succeeded" and env.status(name), 60, "Succeeded", name
    )
    assert _condition(st, "Succeeded")["status"] == "True"
    assert st["completionTime"] and st["failures"] == 0 and st["preemptions"] == 0
    env.until(lambda: {"Created", "Succeeded"} <= set(env.reasons(name)), 10, "events", name)
    # cleanPodPolicy All (the default): the finished pods go; then the TTL deletes the job (kopf's finalizer is
    # released when the daemon stops) and the Secret and Service go with it.
    env.until(lambda: not env.pods(name), 30, "the finished pods to be deleted", name)
    env.until(lambda: env.kube.get(f"{JOBS}/{name}") is None, 30, "the TTL to delete the job")
    assert "TTLExpired" in env.reasons(name)


def test_invalid_spec_gets_a_condition_that_says_what_to_fix_and_no_pods(jobs):
    env, name = jobs, "invalid"
    # What the CRD refuses (a reserved env name, ...) never gets here: test_operator_admission.py. A mount of a
    # volume no volume defines is still only the planner's check (checks.py).
    env.create_job(name, "done", podTemplate={"volumeMounts": [{"name": "nowhere", "mountPath": "/data"}]})
    st = env.until(
        lambda: env.status(name).get("phase") == "Invalid" and env.status(name), 30, "Invalid", name
    )
    cond = _condition(st, "InvalidSpec")
    assert (
        cond["status"] == "True"
        and "spec.podTemplate.volumeMounts[0]" in cond["message"]
        and "which no volume defines" in cond["message"]
    )
    assert env.pods(name) == []
    env.until(lambda: "InvalidSpec" in env.reasons(name), 10, "the InvalidSpec event", name)


def test_checkpoint_request_reaches_the_coordinator_and_suspend_resume(jobs):
    env, name = jobs, "suspend"
    env.create_job(name, "serve", checkpoint={"volume": {"emptyDir": {}}, "suspendTimeoutSeconds": 30})
    env.until(lambda: env.status(name).get("phase") == "Running", 60, "Running", name)
    first = env.live_workers(name)
    assert len(first) == 1

    value = uuid.uuid4().hex[:8]
    env.patch_job(name, {"metadata": {"annotations": {render.ANNOTATION_CHECKPOINT_REQUEST: value}}})
    progress = env.until(
        lambda: (
            value
            in (((env.coordinator_progress(name) or {}).get("checkpointRequest") or {}).get("reason") or "")
            and env.coordinator_progress(name)
        ),
        30,
        "the annotation's checkpoint request at the coordinator",
        name,
    )
    assert (
        progress["checkpointRequest"]["reason"]
        == f"annotation {render.ANNOTATION_CHECKPOINT_REQUEST}={value}"
    )
    st = env.until(
        lambda: env.status(name).get("lastCheckpoint") and env.status(name), 30, "lastCheckpoint", name
    )
    assert st["operator"]["handledCheckpointRequest"] == value
    env.until(lambda: "CheckpointRequested" in env.reasons(name), 10, "the CheckpointRequested event", name)

    env.patch_job(name, {"spec": {"suspend": True}})
    st = env.until(
        lambda: (
            env.status(name).get("phase") == "Suspended" and not env.pods(name, "worker") and env.status(name)
        ),
        60,
        "Suspended with no worker pods",
        name,
    )
    assert _condition(st, "Suspended")["status"] == "True"
    # The pods went after the requested checkpoint was committed, not after the timeout.
    said = [e.get("message") or "" for e in env.events(name) if e.get("reason") == "Suspended"]
    assert any("checkpoint at step" in m for m in said), said
    assert (st["preemptions"], st["failures"]) == (0, 0)

    env.patch_job(name, {"spec": {"suspend": False}})
    st = env.until(
        lambda: (
            env.status(name).get("phase") == "Running"
            and env.status(name)["workers"]["ready"] == 1
            and env.status(name)
        ),
        60,
        "Running again after unsuspend",
        name,
    )
    assert _condition(st, "Suspended")["reason"] == "Resumed"
    again = env.live_workers(name)
    assert [p["metadata"]["name"] for p in again] != [p["metadata"]["name"] for p in first]
    assert int(again[0]["metadata"]["labels"][render.LABEL_RESTART_GENERATION]) > 0
    assert (st["preemptions"], st["failures"]) == (0, 0)


def test_failures_back_off_then_fail_with_pod_exit_code_and_message(jobs):
    env, name = jobs, "crash"
    env.create_job(
        name,
        "crash",
        failurePolicy={"maxFailures": 1, "backoffBaseSeconds": 3, "backoffMaxSeconds": 3, "jitter": 0},
        # the crash mode kills its parent, torchrun's agent: a warm worker's parent is the launcher's forkserver
        podTemplate={"env": [{"name": "FTJOB_WARM_WORKERS", "value": "0"}]},
    )
    st = env.until(
        lambda: env.status(name).get("failures") == 1 and env.status(name), 90, "the first failure", name
    )
    backoff_until = st.get("operator", {}).get("backoffUntil")
    assert st["phase"] == "Restarting" and backoff_until, st
    assert _condition(st, "Restarting")["status"] == "True"
    st = env.until(
        lambda: env.status(name).get("phase") == "Failed" and env.status(name), 90, "the job to fail", name
    )
    assert (st["failures"], st["restarts"], st["preemptions"]) == (2, 1, 0), st
    failed = _condition(st, "Failed")
    last = st["lastFailure"]
    assert failed["reason"] == "BackoffLimitExceeded"
    assert last["pod"] in failed["message"] and "exit code 137" in failed["message"], failed
    assert "fake trainer crashed on purpose" in failed["message"], failed
    assert last["exitCode"] == 137 and last["message"] == "fake trainer crashed on purpose"
    env.until(
        lambda: {"RestartBackoff", "BackoffLimitExceeded"} <= set(env.reasons(name)), 10, "events", name
    )
    # The restart waited out the backoff: generation-1 pods were created no earlier than backoffUntil.
    gen1 = [p for p in env.pods(name) if p["metadata"]["labels"][render.LABEL_RESTART_GENERATION] == "1"]
    created = [p["metadata"]["creationTimestamp"] for p in gen1]
    assert all(c >= backoff_until for c in created), (created, backoff_until)


def test_preempted_worker_is_replaced_at_once_and_counted_as_a_preemption(jobs):
    env, name = jobs, "preempt"
    # A save that takes 6 s (inside the 10 s grace period) keeps the old pod terminating long enough to see that
    # its replacement does not wait for it, even on a loaded machine.
    env.create_job(name, "serve", podTemplate={"env": [{"name": "FAKE_SAVE_SECONDS", "value": "6"}]})
    env.until(
        lambda: env.status(name).get("phase") == "Running" and env.status(name)["workers"]["ready"] == 1,
        60,
        "Running",
        name,
    )
    # Running (ready) only says the worker's container started. Until torchrun has started its workers (importing
    # torch, reaching the store, the rendezvous) it has no SIGTERM handler and dies of the signal at once, and the
    # kubelet then deletes the pod with it: no grace period to see. The fake trainer's first progress report
    # proves both torchrun and the trainer handle SIGTERM now, so the old pod stays for the 6 s save.
    env.until(
        lambda: (env.coordinator_progress(name) or {}).get("step"),
        60,
        "the fake trainer's first progress report",
        name,
    )
    (old,) = env.live_workers(name)
    node = old["spec"]["nodeName"]
    request_preemption(env.kube, node, notice=1.0, replace_after=0.5)

    def replacement_while_old_terminates():
        pods = {p["metadata"]["name"]: p for p in env.pods(name, "worker")}
        new = [n for n in pods if n != old["metadata"]["name"]]
        still = pods.get(old["metadata"]["name"])
        return new and still is not None and still["metadata"].get("deletionTimestamp") and new

    (new_name,) = env.until(
        replacement_while_old_terminates, 30, "a replacement while the old pod terminates", name
    )
    st = env.status(name)
    assert (st["preemptions"], st["failures"], st["restarts"]) == (1, 0, 0), st
    assert _condition(st, "Preempted")["status"] == "True"
    # kopf posts events in the background, shortly after the status write.
    env.until(
        lambda: {"TerminationNotice", "Preempted", "Replaced"} <= set(env.reasons(name)), 10, "events", name
    )
    new = env.kube.get(f"{PODS}/{new_name}")
    assert (
        new["metadata"]["labels"][render.LABEL_RESTART_GENERATION] == "0"
    )  # a replacement, not a job restart
    st = env.until(
        lambda: _condition(env.status(name), "Preempted").get("reason") == "Recovered" and env.status(name),
        60,
        "recovery (desired workers ready again)",
        name,
    )
    assert st["phase"] == "Running" and (st["preemptions"], st["failures"]) == (1, 0)
    assert env.kube.get(f"{PODS}/{new_name}")["spec"]["nodeName"] != node
    # The notice reached the coordinator as a checkpoint request, and the fake trainer answered it.
    assert "termination notice" in (st.get("lastCheckpoint") and env.coordinator_progress(name) or {}).get(
        "checkpointRequest", {}
    ).get("reason", ""), env.coordinator_progress(name)
    # Metrics: the counter comes from the status; the recovery was timed.
    assert env.operator.metric("ftjob_preemptions_total", namespace=NS, job=name) == 1
    assert env.operator.metric("ftjob_failures_total", namespace=NS, job=name) == 0
    assert (env.operator.metric("ftjob_time_to_recover_seconds_count") or 0) >= 1
    assert (env.operator.metric("ftjob_jobs", phase="Running") or 0) >= 1


def test_operator_crash_mid_preemption_makes_no_duplicates_and_keeps_counters(jobs):
    env, name = jobs, "restart"
    env.create_job(name, "serve", workers=2)
    env.until(
        lambda: env.status(name).get("phase") == "Running" and env.status(name)["workers"]["ready"] == 2,
        90,
        "Running with 2 workers",
        name,
    )
    before = env.live_workers(name)
    node = before[0]["spec"]["nodeName"]
    on_node = [p["metadata"]["name"] for p in before if p["spec"]["nodeName"] == node]
    request_preemption(env.kube, node, notice=0.0, replace_after=0.5)
    # Crash the operator the moment it has counted the preemption: the replacement may or may not be created yet.
    env.until(lambda: env.status(name).get("preemptions", 0) >= 1, 30, "the preemption to be counted", name)
    env.operator.crash()
    counted = env.status(name)["preemptions"]
    env.operator.start()
    st = env.until(
        lambda: (
            _condition(env.status(name), "Preempted").get("reason") == "Recovered"
            and env.status(name)["workers"]["ready"] == 2
            and env.status(name)
        ),
        90,
        "recovery after the operator restart",
        name,
    )
    assert st["preemptions"] == len(on_node) and counted <= len(on_node), (st, on_node)
    assert (st["failures"], st["restarts"]) == (0, 0), st
    live = env.live_workers(name)
    assert len(live) == 2, [p["metadata"]["name"] for p in live]
    assert not set(on_node) & {p["metadata"]["name"] for p in live}
    # No pod was created twice for one slot: nothing had to be scaled away.
    assert "ScaledDown" not in env.reasons(name), env.reasons(name)
    assert env.operator.metric("ftjob_preemptions_total", namespace=NS, job=name) == len(on_node)


def _api_requests(env: Env) -> dict[tuple[str, str], int]:
    """The local API server's request counts (GET /metrics): (VERB, resource) -> count."""
    url = env.kube.client.configuration.host + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    counts: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(","))
            key = (labels["verb"].strip('"'), labels["resource"].strip('"'))
            counts[key] = counts.get(key, 0) + int(line.rsplit(" ", 1)[1])
    return counts


def test_passes_read_pods_from_the_cache_and_a_pod_deleted_while_the_operator_is_down_is_replaced(jobs):
    env, name = jobs, "cached"
    env.create_job(name, "serve")
    env.until(
        lambda: env.status(name).get("phase") == "Running" and env.status(name)["workers"]["ready"] == 1,
        60,
        "Running",
        name,
    )
    # Every pass GETs its job fresh: wake the job a few times (an annotation change; one at a time, as the daemon
    # folds a burst of changes into one pass) and count the requests. None of the passes lists pods (nor Services,
    # nor Secrets): they read the watch-fed caches.
    before = _api_requests(env)
    for i in range(5):
        gets = _api_requests(env).get(("GET", "trainingjobs"), 0)
        env.patch_job(name, {"metadata": {"annotations": {"test.ftjob.dev/poke": str(i)}}})
        env.until(
            lambda gets=gets: _api_requests(env).get(("GET", "trainingjobs"), 0) > gets,
            30,
            f"a pass after poke {i}",
            name,
        )
    after = _api_requests(env)
    for resource in ("pods", "services", "secrets"):
        assert after.get(("LIST", resource), 0) == before.get(("LIST", resource), 0), (
            resource,
            before,
            after,
        )
        assert after.get(("GET", resource), 0) == before.get(("GET", resource), 0), (resource, before, after)

    # The operator stops; a worker is deleted while nothing watches; the new operator's cache lists it as gone.
    (old,) = env.live_workers(name)
    coordinators = {p["metadata"]["name"] for p in env.pods(name, render.ROLE_COORDINATOR)}
    env.operator.stop()
    try:
        env.kube.delete(f"{PODS}/{old['metadata']['name']}", grace=0)
        env.until(
            lambda: env.kube.get(f"{PODS}/{old['metadata']['name']}") is None, 30, "the worker gone", name
        )
    finally:
        env.operator.start()
    env.until(
        lambda: [p for p in env.live_workers(name) if p["metadata"]["name"] != old["metadata"]["name"]],
        60,
        "a replacement for the worker deleted while the operator was down",
        name,
    )
    # The first pass after the start saw the full cache: nothing else was created again.
    assert {p["metadata"]["name"] for p in env.pods(name, render.ROLE_COORDINATOR)} == coordinators
    assert len(env.live_workers(name)) == 1, [p["metadata"]["name"] for p in env.live_workers(name)]
