"""The job's NetworkPolicy holds on the local cluster (issue 14): with two jobs running, a pod of job B cannot open
job A's rendezvous port, neither through A's Service nor at A's coordinator pod IP, while both jobs train to the end
untouched. The local cluster's service proxy enforces NetworkPolicy ingress (ftjob_local/netproxy.py,
docs/INTERFACES.md). Job B's workers run tests/e2e/netpolicy_probe.py in place of the trainer (it probes, then runs
the trainer) and write what each connection did to their checkpoint volume; the controls are job B reaching its own
store and the node (this test) reaching job A's."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from e2e_lib import apply, diagnose, needs_operator, pvc_dir, report_step, tiny_job, wait_finished, wait_until
from ftjob_trainer.contract import RDZV_PORT

pytestmark = [pytest.mark.slow, needs_operator]

JOB_A, JOB_B = "np-a", "np-b"
PROBE = Path(__file__).with_name("netpolicy_probe.py")


def get(session, *args: str) -> dict:
    return json.loads(session.kubectl("get", *args, "-o", "json").stdout)


def coordinator(session, job: str) -> dict:
    (pod,) = get(session, "pods", "-l", f"ftjob.dev/job-name={job},ftjob.dev/role=coordinator")["items"]
    return pod


def node_connect(host: str) -> str:
    """What a connection from the node (this process, no pod's) to host:RDZV_PORT does (see netpolicy_probe.py)."""
    with socket.create_connection((host, RDZV_PORT), timeout=5) as conn:
        conn.settimeout(5)
        try:
            return "closed" if conn.recv(1) == b"" else "open"
        except TimeoutError:
            return "open"


def test_a_pod_of_another_job_cannot_open_the_rendezvous_port(session):
    apply(session, tiny_job(JOB_A, steps=400, workers=(1, 1)))
    wait_until(session, lambda: report_step(session, JOB_A) >= 1, 240, "job A to train", job=JOB_A)
    policy = get(session, "networkpolicy", f"{JOB_A}-coordinator")  # made before the coordinator
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "ftjob.dev/job-name": JOB_A,
        "ftjob.dev/role": "coordinator",
    }
    coordinator_a = coordinator(session, JOB_A)
    service_a = get(session, "service", f"{JOB_A}-coordinator")["spec"]["clusterIP"]

    job_b = tiny_job(JOB_B, steps=20, workers=(1, 1))
    spec_b = job_b[1]["spec"]
    spec_b["command"] = [str(PROBE)]
    spec_b["podTemplate"]["env"] += [
        {"name": "NP_PROBE_SERVICE", "value": service_a},
        {"name": "NP_PROBE_POD", "value": coordinator_a["status"]["podIP"]},
    ]
    apply(session, job_b)
    result = pvc_dir(session, JOB_B) / "netpolicy-probe.json"
    wait_until(session, result.exists, 240, "job B's probe", job=JOB_B)
    seen = json.loads(result.read_text())

    # job A was up all along: the same coordinator, ready, and the node (always allowed) reaches its store
    assert coordinator(session, JOB_A)["metadata"]["uid"] == coordinator_a["metadata"]["uid"]
    assert get(session, "trainingjob", JOB_A)["status"]["phase"] == "Running"
    assert node_connect(service_a) == "open"
    assert seen == {"service_a": "closed", "pod_a": "closed", "service_own": "open"}, seen

    for job in (JOB_A, JOB_B):
        st = wait_finished(session, job, 600)
        assert st["phase"] == "Succeeded", diagnose(session, job)
        assert (st["failures"], st["restarts"], st["preemptions"]) == (0, 0, 0), (job, st)
