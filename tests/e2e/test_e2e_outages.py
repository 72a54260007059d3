"""Control-plane outages are free: the API server, the operator and the kubelet are each SIGKILLed while a job
trains and brought back with `ftjob local restart`; the pods keep running through all of it, and the job ends
Succeeded with no failure, no preemption, the same uid and no step trained twice beyond one checkpoint interval."""

from __future__ import annotations

import os
import signal

import pytest
from e2e_lib import (
    apply,
    job_status,
    needs_operator,
    report_step,
    running_workers,
    start_cluster,
    tiny_job,
    wait_finished,
    wait_until,
)
from ftjob_local.cli import main as local_main
from ftjob_local.procs import running
from ftjob_local.timeline import analyze, read_job_events

pytestmark = [pytest.mark.slow, needs_operator]

STEPS = 400  # long enough that the three outages happen while it trains (checked before each)
EVERY = 20  # checkpoint interval: the most steps an outage may cost


@pytest.fixture
def session(tmp_path):
    s = start_cluster(tmp_path / "state")
    try:
        yield s
    finally:
        s.cluster.down(say=lambda *_: None)


def job_or_none(session, name: str) -> dict | None:
    try:
        return session.job(name)
    except Exception:  # noqa: BLE001 - the API server may still be starting
        return None


def kill_and_restart(session, name: str, component: str, record: str) -> None:
    """SIGKILLs one component while the job trains, checks that training goes on without it, restarts it with
    `ftjob local restart` and checks that training goes on after it, on the same pods."""
    step = report_step(session, name)
    assert step < STEPS - 20, f"the job is nearly done at step {step}: the {component} outage would not count"
    pods = {p["metadata"]["uid"] for p in session.pods(name)}
    rec = session.cluster.alive(record)
    os.kill(rec["pid"], signal.SIGKILL)
    wait_until(session, lambda: not running(rec["pid"], rec["start"]), 10, f"the {component} to die")
    # The report file is written by the trainer itself: it shows training while the component is away.
    wait_until(session, lambda: report_step(session, name) >= step + 3, 60, f"steps without the {component}")
    assert local_main(["restart", component, "--state-dir", str(session.cluster.dir)]) == 0
    wait_until(session, lambda: job_or_none(session, name), 30, "the job to be served", job=name)
    after = report_step(session, name)
    wait_until(session, lambda: report_step(session, name) >= after + 3, 60, f"steps after the {component}")
    assert {p["metadata"]["uid"] for p in session.pods(name)} == pods, f"a pod was replaced ({component})"


def test_api_server_operator_and_kubelet_killed_and_restarted_cost_the_job_nothing(session):
    name = "outages"
    job = tiny_job(name, steps=STEPS)
    job[1]["spec"]["checkpoint"]["everySteps"] = EVERY
    apply(session, job)
    wait_until(
        session,
        lambda: report_step(session, name) >= 5 and len(running_workers(session, name)) == 2,
        180,
        "two workers training past step 5",
        job=name,
    )
    before = session.job(name)
    for component, record in (
        ("apiserver", "apiserver"),
        ("operator", "operator"),
        ("kubelet", "node-agent"),
    ):
        kill_and_restart(session, name, component, record)

    st = wait_finished(session, name, 600)
    assert st["phase"] == "Succeeded", st
    assert (st.get("failures") or 0, st.get("preemptions") or 0) == (0, 0), st
    assert session.job(name)["metadata"]["uid"] == before["metadata"]["uid"]
    generation = job_status(session, name)["operator"]["restartGeneration"]
    assert generation == before["status"]["operator"]["restartGeneration"]
    a = analyze(read_job_events(session.cluster.dir, session.ns, name))
    assert (a.final_step, a.skipped) == (STEPS, 0), a.steps[-5:]
    assert a.trained_twice <= EVERY, f"{a.trained_twice} steps trained twice (checkpoint interval {EVERY})"
