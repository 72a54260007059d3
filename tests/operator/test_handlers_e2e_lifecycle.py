"""The real operator (`ftjob operator`, kopf, as a subprocess) against the real local cluster: a job's life.
Owned and labelled children, success and the TTL, an invalid spec, a checkpoint request, suspend and resume,
failures with backoff until the job fails.

Workers run a stand-in trainer (handlers_e2e_testlib.FAKE_TRAINER) under the real torchrun, rendezvousing at the
real coordinator, so each test is about the operator and takes seconds. Every wait polls a condition with a
timeout and prints the job, its pods and the operator's log when it gives up.
"""

from __future__ import annotations

import uuid

import pytest
from ftjob_operator import render
from handlers_e2e_testlib import DEFAULT_IMAGE, JOBS, NS, _condition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
]


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
