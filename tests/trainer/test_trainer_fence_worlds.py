"""Two worlds on one checkpoint folder (issue 10): a starved world (its worker paused, as c10d's keep-alive drops a
starved agent while its worker lives on) and a newer world formed meanwhile. The real coordinator, two single-rank
torchrun runs. The newer world loads the stale one's newest commit and finishes in the uninterrupted run's state;
the stale one, resumed, commits nothing more and exits 75 with the fenced event, reporting no error."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from ftjob_trainer import contract
from trainer_testlib import (
    TINY,
    Procs,
    events_of,
    finish,
    http,
    list_steps,
    log_of,
    read_json,
    report_step,
    start_coordinator,
    wait_for,
)

pytestmark = pytest.mark.slow
TOKEN = "s3cret"
STEPS = 24
# the last event a paused worker emitted says it is between saves: no commit check passed without its commit
BETWEEN_SAVES = (contract.EVENT_STEP, contract.EVENT_CHECKPOINT_COMMITTED)


def args(tmp: Path, name: str, poll: str) -> list[str]:
    return [
        *TINY,
        "--steps",
        str(STEPS),
        "--checkpoint-dir",
        str(tmp / "ckpt"),
        "--checkpoint-every",
        "2",
        "--keep-last",
        "20",
        "--report",
        str(tmp / f"{name}.json"),
        "--poll-interval",
        poll,
        "--progress-every",
        "1",
    ]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """STEPS steps uninterrupted, no checkpoints, on `nproc` ranks: the reference state (run once per size)."""
    done: dict[int, dict] = {}

    def of_size(nproc: int) -> dict:
        if nproc not in done:
            tmp = tmp_path_factory.mktemp(f"baseline{nproc}")
            procs = Procs(tmp)
            try:
                argv = [*TINY, "--steps", str(STEPS), "--report", str(tmp / "base.json")]
                p = procs.torchrun(argv, name="base", nproc=nproc)
                assert finish(p) == 0, log_of(p)[-3000:]
                done[nproc] = read_json(tmp / "base.json")
            finally:
                procs.cleanup()
        return done[nproc]

    return of_size


def paused(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def more_events(p, seen: int):
    return lambda: len(events_of(p)) > seen


def pause_between_saves(p, pid: int) -> list[dict]:
    """SIGSTOP the worker (a starved process) at a moment its last event shows it between saves; its events."""
    while True:
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: paused(pid), timeout=30, proc=p, what="the worker paused")
        evs = events_of(p)
        if evs[-1]["event"] in BETWEEN_SAVES:
            return evs
        os.kill(pid, signal.SIGCONT)  # in the middle of a save: let it go on a little
        wait_for(more_events(p, len(evs)), timeout=60, proc=p, what="the worker's next event")


def of(evs: list[dict], name: str) -> list[dict]:
    return [e for e in evs if e["event"] == name]


@pytest.mark.parametrize(
    ("nproc", "poll", "found_by"),
    # polling every 60 s, no progress is posted before the exit: only the commit check can find the newer world
    [(1, "60", ("commit",)), (1, "0.1", ("commit", "progress")), (2, "60", ("commit",))],
    ids=["commit-check", "progress-or-commit", "two-ranks"],
)
def test_a_stale_world_is_fenced_and_the_newer_world_resumes_exactly(
    procs, tmp_path, baseline, nproc, poll, found_by
):
    _, ports = start_coordinator(procs, TOKEN)
    base = f"http://127.0.0.1:{ports['controlPort']}"

    def env(name: str) -> dict:
        return {
            contract.ENV_COORDINATOR_URL: base,
            contract.ENV_TOKEN: TOKEN,
            contract.ENV_TERMINATION_LOG: str(tmp_path / f"term-{name}"),
        }

    a = procs.torchrun(args(tmp_path, "a", poll), name="a", nproc=nproc, env=env("a"))
    wait_for(
        lambda: report_step(tmp_path / "a.json") >= 3 and list_steps(tmp_path / "ckpt"),
        timeout=240,
        proc=a,
        what="world A past step 3 with a commit",
    )
    # rank 0 decides every commit; other ranks wait for it in the next collective
    (started,) = [e for e in of(events_of(a), contract.EVENT_PROCESS_STARTED) if e["local_rank"] == 0]
    at_pause = pause_between_saves(a, started["pid"])
    a_commits = of(at_pause, contract.EVENT_CHECKPOINT_COMMITTED)
    newest_of_a = max(list_steps(tmp_path / "ckpt"))
    assert newest_of_a == a_commits[-1]["step"]

    b = procs.torchrun(args(tmp_path, "b", poll), name="b", nproc=nproc, env=env("b"))
    wait_for(
        lambda: len(of(events_of(b), contract.EVENT_CHECKPOINT_LOADED)) == nproc,
        timeout=240,
        proc=b,
        what="world B loaded",
    )
    os.kill(started["pid"], signal.SIGCONT)  # the starved world wakes up and goes on
    assert finish(a, timeout=240) != 0, "torchrun (no restarts left) ends when its worker exits 75"
    assert finish(b, timeout=240) == 0, log_of(b)[-4000:]

    # B loaded A's newest commit and ended in the uninterrupted run's state
    assert {e["step"] for e in of(events_of(b), contract.EVENT_CHECKPOINT_LOADED)} == {newest_of_a}
    final = read_json(tmp_path / "b.json")
    assert final["resumed_from_step"] == newest_of_a and final["step"] == STEPS
    assert final["state_sha256"] == baseline(nproc)["state_sha256"]

    # A: every rank fenced, exit 75, no commit after B's world formed, no error report
    evs = events_of(a)
    fenced_by_rank = {e["rank"]: e for e in of(evs, contract.EVENT_FENCED)}
    exits = of(evs, contract.EVENT_EXIT)
    assert sorted(fenced_by_rank) == sorted(e["rank"] for e in exits) == list(range(nproc))
    assert {(e["code"], e["reason"]) for e in exits} == {(contract.EXIT_RESTART, contract.REASON_FENCED)}
    fenced = fenced_by_rank[0]
    assert fenced["where"] in found_by and fenced["newest"] > fenced["epoch"]
    assert all(fenced_by_rank[r]["where"] == "peer" for r in range(1, nproc))
    assert of(evs, contract.EVENT_CHECKPOINT_COMMITTED) == a_commits, "A committed after it was fenced"
    assert all(c["time"] * 1000 < fenced["newest"] for c in a_commits)
    assert json.loads((tmp_path / "term-a").read_text())["reason"] == contract.REASON_FENCED
    code, progress = http("GET", base + contract.ROUTE_PROGRESS, TOKEN)
    assert code == 200 and progress["errors"] == [] and progress["worldEpoch"] == fenced["newest"]
    assert progress["step"] == STEPS and progress["lastCheckpoint"]["step"] == STEPS  # B's, never A's
    assert list_steps(tmp_path / "ckpt")[-1] == STEPS
