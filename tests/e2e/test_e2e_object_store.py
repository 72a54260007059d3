"""On the local cluster, a TrainingJob whose checkpoints live in an object store (spec.checkpoint.uri, credentials
and endpoint from spec.checkpoint.credentialsSecret) survives a preemption with notice: counted as a preemption,
no step lost or trained twice, and its committed checkpoints are the store's marker-committed prefixes.
The store is moto's S3 server (tests/support/s3_server.py), reached through AWS_ENDPOINT_URL."""

from __future__ import annotations

import base64
import time

import pytest
from e2e_lib import apply, job_status, needs_operator, running_workers, tiny_job, wait_finished, wait_until
from ftjob_local.cli import main as local_main
from ftjob_local.demo import read_json
from ftjob_local.timeline import analyze, read_job_events
from support.s3_server import S3Server, objects

pytestmark = [pytest.mark.slow, needs_operator]
STEPS = 40


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.close()


def object_store_job(name: str, bucket: str) -> list[dict]:
    """tiny_job with its checkpoints in the bucket; the claim stays, mounted at /reports, for the trainer's report."""
    pvc, job = tiny_job(name, steps=STEPS, trainer={"flags": {"report": "/reports/report.json"}})
    s = job["spec"]
    s["checkpoint"] = {"uri": f"{bucket}/ckpt", "credentialsSecret": f"{name}-s3", "everySteps": 10}
    s["podTemplate"]["volumes"] = [
        {"name": "reports", "persistentVolumeClaim": {"claimName": f"{name}-checkpoints"}}
    ]
    s["podTemplate"]["volumeMounts"] = [{"name": "reports", "mountPath": "/reports"}]
    return [pvc, job]


def credentials_secret(name: str, values: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
    }


def test_a_preemption_with_notice_loses_no_step_with_checkpoints_in_s3(session, s3):
    name = "s3job"
    bucket = s3.bucket()
    apply(session, [credentials_secret(f"{name}-s3", s3.env()), *object_store_job(name, bucket)])

    def report() -> dict:
        return (
            read_json(session.cluster.dir / "pvcs" / session.ns / f"{name}-checkpoints" / "report.json") or {}
        )

    wait_until(
        session,
        lambda: (report().get("step") or 0) >= 12 and len(running_workers(session, name)) == 2,
        240,
        "two workers training past step 12 (a checkpoint committed in the bucket)",
        job=name,
    )
    node = session.node_of_worker(name)
    notice_at = time.time()
    argv = ["preempt", "--state-dir", str(session.cluster.dir), node, "--notice", "2", "--replace-after", "1"]
    assert local_main(argv) == 0

    st = wait_finished(session, name, 300)
    assert st["phase"] == "Succeeded", st
    assert (st["preemptions"], st["failures"]) == (1, 0), st
    a = analyze(read_job_events(session.cluster.dir, session.ns, name))
    assert len(a.resumes) == 1 and a.resumes[0].t_started > notice_at, a.resumes
    assert (a.final_step, a.trained_twice, a.skipped) == (STEPS, 0, 0)
    final = report()
    assert final["exit_code"] == 0 and final["step"] == STEPS
    prefix = f"{bucket}/ckpt/{session.ns}/{name}"
    assert final["last_checkpoint"] == f"{prefix}/step-{STEPS:09d}"
    assert job_status(session, name)["lastCheckpoint"]["path"] == final["last_checkpoint"]
    markers = sorted(k for k in objects(s3, prefix) if k.endswith("/ftjob.json"))
    assert markers and markers[-1] == f"step-{STEPS:09d}/ftjob.json", markers
