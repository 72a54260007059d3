"""Helpers of the end-to-end tests: the real local cluster with the real operator, kubectl, helpers that wait on
conditions (never fixed sleeps) and say what they saw when they give up."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from ftjob_local.cluster import LocalCluster
from ftjob_local.session import Session
from support.wait import wait_until as support_wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "local-tiny.yaml"
CRD_DIR = REPO / "crds"

# Every e2e test needs the operator's kopf handlers; the other parts are committed.
needs_operator = pytest.mark.skipif(
    importlib.util.find_spec("ftjob_operator.handlers") is None,
    reason="the operator's handlers (ftjob_operator.handlers) are not in this build yet",
)


def start_cluster(state: Path, spot_nodes: int = 2) -> Session:
    cluster = LocalCluster(state)
    cluster.up(nodes=1, spot_nodes=spot_nodes, operator=True, say=lambda *_: None)
    try:
        assert cluster.alive("operator"), (
            f"the operator did not start; see {cluster.log_dir / 'operator.log'}"
        )
        session = Session(cluster)
        session.install_crd()
    except BaseException:
        cluster.down(say=lambda *_: None)
        raise
    return session


def restart_operator(cluster: LocalCluster) -> None:
    """Start the operator again (same command line) after the test stopped it, as a pod restart would."""
    cluster.restart("operator", timeout=30)
    assert cluster.alive("operator")


def restart_apiserver(cluster: LocalCluster) -> None:
    """Start the API server again on its port and state folder (its objects persist there)."""
    cluster.restart("apiserver", timeout=30)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} missing)"


def diagnose(session: Session, job: str | None = None) -> str:
    """What a failing e2e test prints: the job's status, its pods and the operator's last log lines."""
    parts = []
    if job:
        try:
            parts.append("status: " + yaml.safe_dump((session.job(job) or {}).get("status")))
            for p in session.pods(job):
                st = p.get("status") or {}
                parts.append(
                    f"pod {p['metadata']['name']} phase={st.get('phase')} node={p['spec'].get('nodeName')} "
                    f"deleting={bool(p['metadata'].get('deletionTimestamp'))}"
                )
        except Exception as e:  # noqa: BLE001 - diagnostics must not hide the real failure
            parts.append(f"(could not read the job: {e})")
    parts.append("operator log:\n" + tail(session.cluster.log_dir / "operator.log"))
    return "\n".join(parts)


def wait_until(
    session: Session,
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    job: str | None = None,
    interval: float = 0.25,
) -> Any:
    """support.wait_until with what an e2e test prints on failure: the job, its pods and the operator's log."""
    return support_wait_until(
        predicate, timeout, what, interval=interval, diagnose=lambda: diagnose(session, job)
    )


def job_status(session: Session, name: str) -> dict:
    return (session.job(name) or {}).get("status") or {}


def wait_finished(session: Session, name: str, timeout: float) -> dict:
    return wait_until(
        session,
        lambda: (st := job_status(session, name)).get("phase") in ("Succeeded", "Failed") and st,
        timeout,
        f"TrainingJob {name} to finish",
        job=name,
    )


# The trainer flags of the test jobs (also what the uninterrupted baseline runs with).
TEST_FLAGS = {"log-every": "1", "report": "/checkpoints/report.json", "warmup-steps": "2"}


def example_docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


def tiny_job(
    name: str,
    *,
    steps: int = 40,
    workers: tuple[int, int] = (2, 2),
    trainer: dict | None = None,
    spec: dict | None = None,
) -> list[dict]:
    """A claim and a TrainingJob shaped like examples/local-tiny.yaml, smaller and faster for tests.

    min == max by default: the world size never changes, so the final state hash must equal an uninterrupted
    run's exactly. The trainer reports every step as an event (lost steps are counted from the events: see
    ftjob_local.timeline) and keeps its report on the checkpoint volume.
    """
    docs = copy.deepcopy(example_docs())
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    job = next(d for d in docs if d["kind"] == "TrainingJob")
    pvc["metadata"]["name"] = f"{name}-checkpoints"
    job["metadata"]["name"] = name
    s = job["spec"]
    s["workers"] = {"min": workers[0], "max": workers[1]}
    s["checkpoint"]["volume"] = {"persistentVolumeClaim": {"claimName": f"{name}-checkpoints"}}
    extra = dict(trainer or {})
    flags = {**TEST_FLAGS, **extra.pop("flags", {})}
    s["trainer"] = {
        "model": "tiny",
        "steps": steps,
        "globalBatchSize": 4,
        "seqLen": 32,
        "flags": flags,
        **extra,
    }
    s["rendezvous"] = {"lastCallTimeoutSeconds": 1, "keepAliveIntervalSeconds": 1, "keepAliveMaxAttempts": 2}
    # Two ranks on two cores: one thread each.
    s.setdefault("podTemplate", {})["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
    for key, value in (spec or {}).items():
        s[key] = value
    return [pvc, job]


def apply(session: Session, docs: list[dict]) -> None:
    session.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs, sort_keys=False))


def pvc_dir(session: Session, name: str) -> Path:
    return session.cluster.dir / "pvcs" / session.ns / f"{name}-checkpoints"


def live_workers(session: Session, job: str) -> list[dict]:
    return [
        p
        for p in session.pods(job)
        if p["metadata"]["labels"].get("ftjob.dev/role") == "worker"
        and not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") in ("Pending", "Running")
    ]


def running_workers(session: Session, job: str) -> list[dict]:
    return [p for p in live_workers(session, job) if p["status"].get("phase") == "Running"]


def report_step(session: Session, job: str) -> int:
    from ftjob_local.demo import read_json

    doc = read_json(pvc_dir(session, job) / "report.json")
    return int(doc.get("step") or 0) if doc else 0
