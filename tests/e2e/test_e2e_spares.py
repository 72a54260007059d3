"""Warm spares (spec.workers.spares): a spare worker pod waits in the rendezvous with torch imported; when a
training worker's node is preempted, the spare takes its place (no pod start on the way back to training), the
operator starts a new spare, and not a step is lost."""

from __future__ import annotations

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
from ftjob_local.timeline import analyze, read_job_events, training_pods

pytestmark = [pytest.mark.slow, needs_operator]


@pytest.fixture
def session(tmp_path):
    """Three spot nodes: two workers and the spare, one node each."""
    s = start_cluster(tmp_path / "state", spot_nodes=3)
    try:
        yield s
    finally:
        s.cluster.down(say=lambda *_: None)


def test_a_warm_spare_takes_the_preempted_workers_place(session):
    name = "spares"
    apply(session, tiny_job(name, steps=60, spec={"workers": {"min": 2, "max": 2, "spares": 1}}))

    def two_training_and_a_spare():
        events = read_job_events(session.cluster.dir, session.ns, name)
        training = training_pods(events)
        running = {p["metadata"]["name"] for p in running_workers(session, name)}
        if report_step(session, name) < 12 or len(training) != 2 or len(running) != 3:
            return None
        return set(training), running - set(training)

    training, (spare,) = wait_until(
        session, two_training_and_a_spare, 240, "two workers training past step 12 and a spare", job=name
    )
    assert job_status(session, name)["workers"] == {"desired": 2, "active": 2, "ready": 2, "spares": 1}
    lost = sorted(training)[0]
    node = session.node_of_worker(name, among=[lost])
    assert local_main(["preempt", "--state-dir", str(session.cluster.dir), node, "--replace-after", "0"]) == 0

    st = wait_finished(session, name, 300)
    assert st["phase"] == "Succeeded", st
    assert (st["preemptions"], st["failures"]) == (1, 0), st
    a = analyze(read_job_events(session.cluster.dir, session.ns, name))
    assert a.lost_steps == 0, (a.trained_twice, a.skipped)
    (resume,) = a.resumes
    # the round after the preemption: the survivor and the spare, which was already running before the notice
    assert {p.pod: p.role for p in resume.pods} == {
        next(iter(training - {lost})): "survivor",
        spare: "replacement",
    }, resume.pods
    # a new spare was started in the lost worker's place (its log outlives it: finished pods are cleaned up)
    pods = {d.name for d in (session.cluster.dir / "logs" / session.ns).glob(f"{name}-worker-*")}
    assert len(pods - training - {spare}) == 1, pods
