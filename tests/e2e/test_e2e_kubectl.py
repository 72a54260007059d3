"""The user's kubectl story against the local cluster and the real operator: apply the CRD and
examples/local-tiny.yaml, get (printer columns), describe, logs, annotate for a checkpoint, scale, delete."""

from __future__ import annotations

import re

import pytest
from e2e_lib import CRD_DIR, EXAMPLE, job_status, live_workers, needs_operator, running_workers, wait_until
from ftjob_local.timeline import of
from ftjob_trainer import contract

pytestmark = [pytest.mark.slow, needs_operator]
NAME = "local-tiny"
COLUMNS = ["NAME", "PHASE", "READY", "DESIRED", "STEP", "CHECKPOINT", "PREEMPTIONS", "FAILURES", "AGE"]


def test_kubectl_story(session):
    k = session.kubectl
    assert re.search(
        r"customresourcedefinition.apiextensions.k8s.io/trainingjobs.ftjob.dev (unchanged|configured)",
        k("apply", "-f", str(CRD_DIR)).stdout,
    )
    out = k("apply", "-f", str(EXAMPLE)).stdout
    assert (
        "persistentvolumeclaim/local-tiny-checkpoints created" in out
        and f"trainingjob.ftjob.dev/{NAME} created" in out
    )
    wait_until(
        session,
        lambda: len(running_workers(session, NAME)) == 2 and job_status(session, NAME).get("step"),
        180,
        "two running workers and a reported step",
        job=NAME,
    )

    # get: the printer columns, filled in.
    table = k("get", "tj").stdout.splitlines()
    assert table[0].split() == COLUMNS, table
    row = dict(zip(COLUMNS, table[1].split(), strict=False))
    assert row["NAME"] == NAME and row["PHASE"] == "Running" and row["DESIRED"] == "2", table
    assert int(row["STEP"]) >= 1, table
    wide = k(
        "get", "trainingjobs.ftjob.dev", NAME, "-o", "jsonpath={.status.phase}/{.status.workers.ready}"
    ).stdout
    assert wide == "Running/2"

    # describe: spec, status and the operator's events.
    described = k("describe", "tj", NAME).stdout
    for text in ("Name:", NAME, "Workers:", "Status:", "Events:", "Created"):
        assert text in described, described

    # logs of a worker: the trainer's own lines, its events among them.
    worker = running_workers(session, NAME)[0]["metadata"]["name"]

    def events() -> list[dict]:
        return contract.parse_events(k("logs", worker).stdout.splitlines())

    logs = k("logs", worker).stdout
    assert "ftjob.train" in logs and of(events(), contract.EVENT_PROCESS_STARTED), logs[-2000:]
    wait_until(session, lambda: of(events(), contract.EVENT_FIRST_STEP), 60, "a trained step", job=NAME)

    # annotate: a checkpoint now, answered by a committed checkpoint.
    k("annotate", "tj", NAME, "ftjob.dev/checkpoint-request=e2e-1")
    wait_until(
        session,
        lambda: job_status(session, NAME)["operator"].get("handledCheckpointRequest") == "e2e-1",
        60,
        "the operator to take the checkpoint request",
        job=NAME,
    )
    saved = wait_until(
        session, lambda: of(events(), contract.EVENT_CHECKPOINT_REQUESTED), 60, "the requested save", job=NAME
    )
    step = int(saved[-1]["step"])
    wait_until(
        session,
        lambda: (job_status(session, NAME).get("lastCheckpoint") or {}).get("step", -1) >= step,
        60,
        "status.lastCheckpoint to reach the requested save",
        job=NAME,
    )
    events = k("get", "events", "--field-selector", f"involvedObject.name={NAME}").stdout
    assert "CheckpointRequested" in events, events

    # scale: the scale subresource moves spec.workers.replicas; the operator follows.
    assert f"trainingjob.ftjob.dev/{NAME} scaled" in k("scale", "tj", NAME, "--replicas=1").stdout
    assert k("get", "tj", NAME, "-o", "jsonpath={.spec.workers.replicas}").stdout == "1"
    wait_until(
        session,
        lambda: (
            job_status(session, NAME).get("workers", {}).get("desired") == 1
            and len(live_workers(session, NAME)) == 1
        ),
        90,
        "one worker after kubectl scale",
        job=NAME,
    )

    # delete: the job and, through owner references, its pods, Service and Secret.
    assert f'trainingjob.ftjob.dev "{NAME}" deleted' in k("delete", "tj", NAME, "--wait=false").stdout
    wait_until(
        session, lambda: k("get", "tj", NAME, check=False).returncode != 0, 60, "the job to go", job=NAME
    )
    wait_until(session, lambda: not session.pods(NAME), 90, "the pods to be garbage collected")
    assert "NotFound" in k("get", "service", f"{NAME}-coordinator", check=False).stderr
