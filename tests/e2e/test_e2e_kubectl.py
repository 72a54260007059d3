"""The user's kubectl story against the local cluster and the real operator: apply the CRD and
examples/local-tiny.yaml (with more steps), get (printer columns: progress, ETA, goodput), describe (what users read
at the top of the status), logs, a preemption with notice and what it cost (status.progress, the metrics), an operator
restart that changes none of it, annotate for a checkpoint, scale, the end, delete."""

from __future__ import annotations

import re
import shutil
import urllib.request

import pytest
import yaml
from e2e_lib import (
    CRD_DIR,
    example_docs,
    job_status,
    live_workers,
    needs_operator,
    pvc_dir,
    restart_operator,
    running_workers,
    wait_finished,
    wait_until,
)
from ftjob_local.cli import main as local_main
from ftjob_local.timeline import of
from ftjob_operator import api
from ftjob_trainer import contract
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.slow, needs_operator]
NAME = "local-tiny"
COLUMNS = [
    "NAME",
    "PHASE",
    "READY",
    "PROGRESS",
    "ETA",
    "GOODPUT",
    "PREEMPTIONS",
    "FAILURES",
    "CHECKPOINT AGE",
    "AGE",
]
WIDE = [*COLUMNS, "DESIRED", "STEP", "CHECKPOINT", "LOST TO PREEMPTIONS", "TOKENS/S"]


def table(session, *args: str) -> tuple[str, dict[str, str]]:
    """`kubectl get tj NAME`: the header line and the row, cut at the header's column offsets (names have spaces)."""
    header, row = session.kubectl("get", "tj", NAME, *args).stdout.splitlines()[:2]
    names = WIDE if "wide" in args else COLUMNS
    assert header.split() == " ".join(names).split(), header
    starts, at = [], 0
    for n in names:  # in order: "AGE" after "CHECKPOINT AGE", "CHECKPOINT" after "STEP"
        at = re.compile(rf"(?<!\S){re.escape(n)}(?!\S)").search(header, at).start()
        starts.append(at)
        at += len(n)
    ends = [*starts[1:], None]
    return header, {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def progress(session) -> dict:
    return job_status(session, NAME).get("progress") or {}


def humanized(name: str) -> str:
    """How kubectl describe prints a field name: knownPods -> Known Pods."""
    words = re.sub(r"([A-Z])", r" \1", name)
    return words[0].upper() + words[1:]


def status_keys(described: str) -> list[str]:
    """The top-level keys of the Status section of `kubectl describe` (two spaces in, then a key)."""
    block = described.split("\nStatus:\n", 1)[1].split("\nEvents:", 1)[0]
    return [m.group(1) for m in re.finditer(r"^  ([A-Z][A-Za-z ]*):", block, re.M)]


def scrape(session) -> dict[tuple[str, tuple], float]:
    port = session.cluster.alive("operator")["metricsPort"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


# The example's 100 steps train in about 16 s on a quiet machine, less than this story needs while the job runs
# (describe, logs, a checkpoint request, scale; a preemption and an operator restart): the same job, longer.
STORY_STEPS = 400


def apply_example(session) -> None:
    docs = example_docs()
    job = next(d for d in docs if d["kind"] == "TrainingJob")
    assert (
        job["spec"]["trainer"]["steps"] < STORY_STEPS
    )  # the example itself is what the user applies, but shorter
    job["spec"]["trainer"]["steps"] = STORY_STEPS
    out = session.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs, sort_keys=False)).stdout
    assert f"trainingjob.ftjob.dev/{NAME} created" in out, out
    wait_until(
        session,
        lambda: len(running_workers(session, NAME)) == 2 and progress(session).get("etaSeconds") is not None,
        180,
        "two running workers and a first progress report",
        job=NAME,
    )


def delete_example(session) -> None:
    k = session.kubectl
    assert f'trainingjob.ftjob.dev "{NAME}" deleted' in k("delete", "tj", NAME, "--wait=false").stdout
    wait_until(
        session, lambda: k("get", "tj", NAME, check=False).returncode != 0, 60, "the job to go", job=NAME
    )
    wait_until(session, lambda: not session.pods(NAME), 90, "the pods to be garbage collected")
    assert "NotFound" in k("get", "service", f"{NAME}-coordinator", check=False).stderr
    k("delete", "pvc", f"{NAME}-checkpoints")  # the next story starts from no checkpoint
    shutil.rmtree(pvc_dir(session, NAME), ignore_errors=True)  # the local cluster's folder of the claim


def test_kubectl_story(session):
    k = session.kubectl
    assert re.search(
        r"customresourcedefinition.apiextensions.k8s.io/trainingjobs.ftjob.dev (unchanged|configured)",
        k("apply", "-f", str(CRD_DIR)).stdout,
    )
    apply_example(session)

    # get: the printer columns, filled in.
    header, row = table(session)
    assert len(header) <= 120, header
    assert row["NAME"] == NAME and row["PHASE"] == "Running" and row["READY"] == "2", row
    assert 0 < float(row["PROGRESS"]) < 100 and int(row["ETA"]) > 0 and 0 <= float(row["GOODPUT"]) <= 1, row
    assert (row["PREEMPTIONS"], row["FAILURES"]) == ("0", "0"), row
    _, wide = table(session, "-o", "wide")
    assert wide["DESIRED"] == "2" and int(wide["STEP"]) >= 1 and float(wide["TOKENS/S"]) > 0, wide
    ready = k("get", "trainingjobs.ftjob.dev", NAME, "-o", "jsonpath={.status.phase}/{.status.workers.ready}")
    assert ready.stdout == "Running/2"

    # describe: spec, status and the operator's events; the status's top level is what users read.
    described = k("describe", "tj", NAME).stdout
    for text in ("Name:", NAME, "Workers:", "Status:", "Events:", "Created"):
        assert text in described, described
    keys = status_keys(described)
    assert {"Phase", "Progress", "Preemptions", "Workers", "Operator"} <= set(keys), keys
    assert not set(keys) & {humanized(n) for n in api.LEGACY_BOOKKEEPING}, keys

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
    events_out = k("get", "events", "--field-selector", f"involvedObject.name={NAME}").stdout
    assert "CheckpointRequested" in events_out, events_out

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
    delete_example(session)


def test_what_a_preemption_cost_and_an_operator_restart_that_changes_none_of_it(session):
    """The example survives one preemption with notice: progress and ETA while it runs, then goodput and the seconds
    the preemption cost (status, columns, metrics); an operator restart in between changes nothing but what time
    explains."""
    apply_example(session)
    _, first = table(session)
    later = wait_until(
        session,
        lambda: (
            (row := table(session)[1])["PHASE"] == "Running"
            and float(row["PROGRESS"]) > float(first["PROGRESS"])
            and int(row["ETA"]) < int(first["ETA"])
            and row
        ),
        60,
        "PROGRESS to grow and ETA to shrink while it runs",
        job=NAME,
    )
    assert 0 < float(later["GOODPUT"]) <= 1, later
    before_preemption = job_status(session, NAME)["progress"]
    node = session.node_of_worker(NAME)
    preempt = [
        "preempt",
        "--state-dir",
        str(session.cluster.dir),
        node,
        "--notice",
        "2",
        "--replace-after",
        "1",
    ]
    assert local_main(preempt) == 0

    # Resumed and charged to the preemption; then back at full size (or done).
    def settled() -> dict | None:
        st = job_status(session, NAME)
        charged = (st.get("progress") or {}).get("lost", {}).get("preemptions", {}).get("seconds", 0) > 0
        closed = not st["operator"].get("interruption") or st.get("phase") == "Succeeded"
        return st if charged and closed else None

    st = wait_until(session, settled, 240, "the resume, charged to the preemption", job=NAME)
    assert (st["preemptions"], st["failures"]) == (1, 0), st
    assert st["progress"]["lost"]["failures"] == {"seconds": 0, "steps": 0}, st["progress"]
    assert st["progress"]["keptSeconds"] >= before_preemption["keptSeconds"] > 0
    # The metrics: the new series from the status, and the recovery's time to its first step.
    job = (("job", NAME), ("namespace", session.ns))
    metrics = scrape(session)
    assert metrics[("ftjob_recovery_seconds_count", (("cause", "preemption"),))] == 1, metrics
    for series in ("ftjob_job_progress_ratio", "ftjob_job_goodput_ratio", "ftjob_job_tokens_per_second"):
        assert (series, job) in metrics, series
    assert metrics[("ftjob_job_checkpoint_age_seconds", job)] >= 0

    # An operator restart changes none of it beyond what the time that passed explains.
    st = job_status(session, NAME)
    before, seen_step_at = st["progress"], contract.parse_time(st["operator"]["run"]["stepTime"])
    restart_operator(session.cluster)
    wait_until(  # the new process served the job: its first pass is written
        session,
        lambda: ("ftjob_job_goodput_ratio", job) in scrape(session),
        120,
        "the restarted operator's pass",
    )
    st = job_status(session, NAME)
    after = st["progress"]
    updated_at = contract.parse_time(after["updatedAt"])
    passed = (updated_at - contract.parse_time(before["updatedAt"])).total_seconds()
    assert after["lost"] == before["lost"] and st["preemptions"] == 1, (before, after)
    assert abs(after["elapsedSeconds"] - before["elapsedSeconds"] - passed) <= 1.5, (before, after, passed)
    # Training time kept since: at most the time from the last step the old operator saw to the new update.
    since_seen = max(0.0, (updated_at - seen_step_at).total_seconds()) + 1  # updatedAt has whole seconds
    assert before["keptSeconds"] <= after["keptSeconds"] <= before["keptSeconds"] + since_seen, (
        before,
        after,
    )
    assert after["goodput"] == pytest.approx(after["keptSeconds"] / after["elapsedSeconds"], abs=1e-4)

    # The end: goodput in (0, 1), the preemption's seconds lost, none to failures; columns and metrics agree.
    st = wait_finished(session, NAME, 600)
    assert st["phase"] == "Succeeded" and (st["preemptions"], st["failures"]) == (1, 0), st
    final = st["progress"]
    assert 0 < final["goodput"] < 1 and final["percent"] == 100 and final["etaSeconds"] == 0, final
    assert final["lost"]["preemptions"] == after["lost"]["preemptions"], final
    assert final["lost"]["preemptions"]["seconds"] > 0 and final["lost"]["failures"] == {
        "seconds": 0,
        "steps": 0,
    }
    _, end = table(session)
    assert (end["PHASE"], end["PROGRESS"], end["ETA"], end["PREEMPTIONS"]) == (
        "Succeeded",
        "100",
        "0",
        "1",
    ), end
    metrics = scrape(session)
    assert metrics[("ftjob_job_goodput_ratio", job)] == final["goodput"]
    assert metrics[("ftjob_job_progress_ratio", job)] == 1.0
    lost = metrics[("ftjob_job_lost_seconds_total", (("cause", "preemption"), *job))]
    assert lost == final["lost"]["preemptions"]["seconds"] > 0
    delete_example(session)
