"""Restarts of the control side while a job runs: the operator killed in the middle of a preemption creates no
duplicate pods and loses no counter; the API server restarted keeps every object and the job goes on."""

from __future__ import annotations

import time

import pytest
from e2e_lib import (
    apply,
    job_status,
    live_workers,
    needs_operator,
    report_step,
    restart_apiserver,
    restart_operator,
    running_workers,
    start_cluster,
    tiny_job,
    wait_until,
)
from ftjob_local.cli import main as local_main
from ftjob_local.timeline import analyze, read_job_events

pytestmark = [pytest.mark.slow, needs_operator]
STEPS = 300


@pytest.fixture
def session(tmp_path):
    """A cluster of its own: these tests stop and start its parts."""
    s = start_cluster(tmp_path / "state")
    try:
        yield s
    finally:
        s.cluster.down(say=lambda *_: None)


def worker_names(session, job: str) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in session.pods(job)
        if p["metadata"]["labels"]["ftjob.dev/role"] == "worker"
    }


def test_control_plane_restart_then_operator_restart_in_the_middle_of_a_preemption(session):
    name = "restarts"
    # Enough steps that the preemption in step 2 comes well before the end: at 60 the job (about 10 steps/s on a
    # quiet machine) once finished during the notice, and the survivor's agent then waited in torchrun's exit barrier.
    apply(session, tiny_job(name, steps=STEPS))
    wait_until(
        session,
        lambda: report_step(session, name) >= 8 and len(running_workers(session, name)) == 2,
        180,
        "two workers training past step 8",
        job=name,
    )

    # 1. The API server goes down and comes back: every object is intact and training never stops.
    before_job = session.job(name)
    before_pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in session.pods(name)}
    session.cluster.down(only=["apiserver"], say=lambda *_: None)
    step = report_step(session, name)
    deadline = time.monotonic() + 30
    while report_step(session, name) < step + 3:  # the report file is written without the API server
        assert time.monotonic() < deadline, f"training stalled at step {step} while the API server was down"
        time.sleep(0.2)
    restart_apiserver(session.cluster)
    after_job = wait_until(session, lambda: session.job(name), 30, "the job to be served again")
    assert after_job["metadata"]["uid"] == before_job["metadata"]["uid"]
    assert after_job["spec"] == before_job["spec"]
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in session.pods(name)} == before_pods
    for counter in ("preemptions", "failures", "restarts"):
        assert after_job["status"].get(counter) == before_job["status"].get(counter), counter
    generation = after_job["status"]["operator"]["restartGeneration"]
    assert generation == before_job["status"]["operator"]["restartGeneration"]

    # 2. A preemption with notice, and the operator killed while it runs; back once the node is gone.
    wait_until(
        session,
        lambda: report_step(session, name) >= 20 and len(running_workers(session, name)) == 2,
        120,
        "training past step 20 after the control plane restart",
        job=name,
    )
    originals = worker_names(session, name)
    node = session.node_of_worker(name)
    assert (
        local_main(
            [
                "preempt",
                "--state-dir",
                str(session.cluster.dir),
                node,
                "--notice",
                "2",
                "--replace-after",
                "1",
            ]
        )
        == 0
    )
    session.cluster.down(only=["operator"], say=lambda *_: None)
    wait_until(
        session, lambda: session.kube.get(f"/api/v1/nodes/{node}") is None, 60, f"{node} to go", job=name
    )
    assert worker_names(session, name) <= originals, "a pod was created while the operator was down"
    restart_operator(session.cluster)

    seen: set[str] = set()
    most_live = 0

    def finished():
        nonlocal most_live
        seen.update(worker_names(session, name))
        most_live = max(most_live, len(live_workers(session, name)))
        st = job_status(session, name)
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait_until(
        session, finished, 240, "the job to finish after the operator restart", job=name, interval=0.2
    )
    assert st["phase"] == "Succeeded", st
    assert (st["preemptions"], st["failures"]) == (1, 0), st
    replacements = seen - originals
    assert len(replacements) == 1, f"expected one replacement worker, saw {sorted(replacements)}"
    assert most_live <= 2, f"{most_live} live workers at once (desired 2)"
    a = analyze(read_job_events(session.cluster.dir, session.ns, name))
    assert (a.final_step, a.lost_steps, len(a.resumes)) == (STEPS, 0, 1), a.resumes
