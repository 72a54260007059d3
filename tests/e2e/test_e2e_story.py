"""The whole story on the local cluster with the real operator, trainer, torchrun and kubectl:
a preemption with notice costs no step and ends in the same state as an uninterrupted run; a hard preemption
resumes from the last periodic checkpoint; a trainer that crashes on purpose spends its failure budget with
backoff and ends Failed with the reason in the status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_lib import (
    TEST_FLAGS,
    apply,
    job_status,
    needs_operator,
    report_step,
    running_workers,
    tiny_job,
    wait_finished,
    wait_until,
)
from ftjob_local.cli import main as local_main
from ftjob_local.demo import read_json
from ftjob_local.procs import kill_tree
from ftjob_local.timeline import analyze, of, read_job_events
from ftjob_trainer import contract

pytestmark = [pytest.mark.slow, needs_operator]
BIN = Path(sys.executable).parent
STEPS = 60


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The same trainer config, uninterrupted, straight under torchrun (2 ranks); started at once, in parallel."""
    d = tmp_path_factory.mktemp("baseline")
    flags = [f"--{k}={v}" for k, v in TEST_FLAGS.items() if k != "report"]
    argv = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "ftjob_trainer.train",
        "--model=tiny",
        f"--steps={STEPS}",
        "--global-batch-size=4",
        "--seq-len=32",
        *flags,
        f"--report={d / 'report.json'}",
        f"--termination-log={d / 'termination.log'}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    with open(d / "torchrun.log", "w") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=d, start_new_session=True
        )

    def result() -> str:
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail("the uninterrupted baseline run did not finish in 300s")
        assert code == 0, (d / "torchrun.log").read_text()[-3000:]
        return read_json(d / "report.json")["state_sha256"]

    try:
        yield result
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid, signal.SIGKILL)  # torchrun, its session and its workers' own sessions
            proc.wait(timeout=30)


def preempt(session, node: str, *extra: str) -> float:
    t = time.time()
    assert local_main(["preempt", "--state-dir", str(session.cluster.dir), node, *extra]) == 0
    return t


def test_preemption_with_notice_then_hard_preemption(session, baseline):
    name = "story"
    apply(session, tiny_job(name, steps=STEPS))
    wait_until(
        session,
        lambda: report_step(session, name) >= 12 and len(running_workers(session, name)) == 2,
        180,
        "two workers training past step 12",
        job=name,
    )
    originals = {p["metadata"]["name"] for p in running_workers(session, name)}
    notice_at = preempt(session, session.node_of_worker(name), "--notice", "2", "--replace-after", "1")

    # Recovered and past the first periodic checkpoint (every 10 steps) after the resume: then a hard kill, no
    # notice. (The stop step depends on when the notice lands, so it is read from the logs, not assumed.)
    def past_a_periodic_checkpoint_after_the_resume() -> bool:
        a = analyze(read_job_events(session.cluster.dir, session.ns, name))
        if not a.resumes or not a.steps or job_status(session, name).get("preemptions") != 1:
            return False
        next_periodic = (a.resumes[0].from_step // 10 + 1) * 10
        return a.steps[-1][1] >= next_periodic + 3 and len(running_workers(session, name)) == 2

    wait_until(
        session,
        past_a_periodic_checkpoint_after_the_resume,
        240,
        "recovery, then a periodic checkpoint after the resume",
        job=name,
        interval=0.5,
    )
    killed_at = preempt(session, session.node_of_worker(name), "--hard", "--replace-after", "1")

    st = wait_finished(session, name, 240)
    assert st["phase"] == "Succeeded", st
    assert (st["preemptions"], st["failures"]) == (2, 0), st
    events = read_job_events(session.cluster.dir, session.ns, name)
    a = analyze(events)
    assert len(a.resumes) == 2, a.resumes

    # With notice: all ranks stopped at the same step and saved it; training resumed from exactly that step.
    exits = of(events, contract.EVENT_EXIT, code=contract.EXIT_RESTART)
    stops = [e for e in exits if notice_at < e["time"] < killed_at]
    assert {e["rank"] for e in stops} == {0, 1}, stops
    assert len({e["step"] for e in stops}) == 1, stops
    assert a.resumes[0].from_step == stops[0]["step"] >= 12, a.resumes
    # A replacement worker joined and trained.
    trained_in = {e["pod"] for e in of(events, contract.EVENT_PROCESS_STARTED) if e["time"] > notice_at}
    assert trained_in - originals, f"no replacement trained: {trained_in} vs original {originals}"

    # Hard: no save; resumed from the last periodic checkpoint and trained the steps after it again.
    # The kill lands a moment after `killed_at`: count what rank 0 did until the next round started instead.
    round_two = a.resumes[1].t_started
    periodic = [e["step"] for e in of(events, contract.EVENT_CHECKPOINT_COMMITTED) if e["time"] < round_two]
    reached = max(e["step"] for e in of(events, contract.EVENT_STEP) if e["time"] < round_two)
    assert periodic[-1] % 10 == 0 and periodic[-1] < reached, (periodic, reached)
    assert a.resumes[1].from_step == periodic[-1], a.resumes
    # Steps trained twice come from the hard kill only: the preemption with notice lost none.
    assert (a.final_step, a.trained_twice, a.skipped) == (STEPS, reached - periodic[-1], 0)

    # Resumes are exact: the end state is bit-identical to the uninterrupted run's.
    report = read_json(session.cluster.dir / "pvcs" / session.ns / f"{name}-checkpoints" / "report.json")
    assert report["exit_code"] == 0 and report["step"] == STEPS
    assert report["state_sha256"] == baseline()


CRASHING_DATA = """\
# A data factory for ftjob's trainer (--data-factory crashing_data:make) whose samples run out on purpose: the
# real trainer crashes a few steps in, reports the error to the coordinator, and torchrun restarts it.
import torch
from torch.utils.data import Dataset


class Crashing(Dataset):
    def __init__(self, seq_len, vocab_size, seed):
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed

    def __len__(self):
        return 1_000_000

    def __getitem__(self, index):
        if index >= 24:
            raise RuntimeError(f"crashed on purpose (e2e test) at sample {index}")
        return (index * 7919 + self.seed + torch.arange(self.seq_len + 1)) % self.vocab_size


def make(seq_len, vocab_size, seed):
    return Crashing(seq_len, vocab_size, seed)
"""


def test_crashing_trainer_spends_failure_budget_with_backoff(session, tmp_path):
    name = "crash"
    (tmp_path / "crashing_data.py").write_text(CRASHING_DATA)
    docs = tiny_job(
        name,
        workers=(1, 1),
        trainer={"flags": {"data-factory": "crashing_data:make"}},
        spec={
            "failurePolicy": {"maxFailures": 2, "backoffBaseSeconds": 2, "backoffMaxSeconds": 8, "jitter": 0},
        },
    )
    tpl = docs[1]["spec"]["podTemplate"]
    tpl["env"].append({"name": "PYTHONPATH", "value": "/scripts"})
    tpl["volumes"] = [{"name": "scripts", "hostPath": {"path": str(tmp_path), "type": "Directory"}}]
    tpl["volumeMounts"] = [{"name": "scripts", "mountPath": "/scripts"}]
    apply(session, docs)

    # Watch the backoff as it happens: no pod of a new restart generation before status.operator.backoffUntil.
    from ftjob_trainer.contract import parse_time

    seen: dict[int, float] = {}  # restart generation -> first time a worker of it was listed
    backoffs: dict[int, float] = {}  # restart generation -> backoffUntil that preceded it

    def finished():
        st = job_status(session, name)
        now = time.time()
        book = st.get("operator") or {}
        if book.get("backoffUntil"):
            backoffs.setdefault(
                book.get("restartGeneration", 0), parse_time(book["backoffUntil"]).timestamp()
            )
        for p in session.pods(name):
            if p["metadata"]["labels"].get("ftjob.dev/role") == "worker":
                seen.setdefault(int(p["metadata"]["labels"]["ftjob.dev/restart-generation"]), now)
        # Fail fast, saying why, when the crashes never leave the pod. The warm launcher restarts a crashed trainer
        # in about a second and the operator reads the coordinator every 10 s: 40 crashes are several reads.
        events = read_job_events(session.cluster.dir, session.ns, name)
        crashes = len(of(events, contract.EVENT_EXIT, code=contract.EXIT_ERROR))
        if crashes > 40 and not st.get("failures"):
            pytest.fail(
                f"the trainer crashed {crashes} times inside its pod (torchrun restarted it each time) and "
                "the operator counted no failure"
            )
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait_until(session, finished, 180, "the crashing job to end", job=name, interval=0.2)
    assert st["phase"] == "Failed", st
    assert (st["failures"], st["restarts"]) == (3, 2), st
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    # The pod kept running (torchrun restarted the trainer in it): the trainer's error report is what counted.
    last = st["lastFailure"]
    assert (last["reason"], last["exitCode"]) == ("TrainerError", 1), last
    assert last["message"].startswith("rank 0 after step 6: RuntimeError: crashed on purpose"), last
    for part in (last["pod"], "exit code 1", "crashed on purpose (e2e test) at sample 24"):
        assert part in failed["message"], failed
    assert st["preemptions"] == 0
    assert sorted(seen) == [0, 1, 2], seen
    for gen in (1, 2):
        assert gen in backoffs, f"no backoffUntil seen before restart generation {gen}: {backoffs}"
        assert seen[gen] >= backoffs[gen] - 1.0, (gen, seen, backoffs)  # backoffUntil has 1 s resolution

    # kopf posts events after the status patch that ends the job, so the last one may still be on its way.
    def reasons_so_far():
        reasons = [
            e["reason"] for e in session.events() if (e.get("involvedObject") or {}).get("name") == name
        ]
        return reasons if "BackoffLimitExceeded" in reasons else None

    reasons = wait_until(session, reasons_so_far, 30, "the BackoffLimitExceeded event", job=name)
    assert reasons.count("RestartBackoff") >= 2, reasons
    print(json.dumps({"failures": st["failures"], "backoffUntil": backoffs}))
