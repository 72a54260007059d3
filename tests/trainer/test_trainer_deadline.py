"""The save deadline: when the measured save time cannot fit FTJOB_SAVE_DEADLINE_SECONDS, the trainer keeps the
last committed checkpoint instead of starting a save that would be killed, and says so."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from trainer_testlib import TINY, events_of, finish, list_steps, log_of, read_json, report_step, wait_for

pytestmark = pytest.mark.slow


def test_save_that_cannot_fit_is_skipped_and_the_last_committed_kept(procs, tmp_path):
    ckpt, report = tmp_path / "ckpt", tmp_path / "r.json"
    p = procs.torchrun(
        [
            *TINY,
            "--steps",
            "400",
            "--checkpoint-dir",
            str(ckpt),
            "--checkpoint-every",
            "3",
            "--report",
            str(report),
        ],
        name="run",
        # a save takes ~0.1 s here (measured by the periodic saves); 1 ms can never fit
        env={"FTJOB_SAVE_DEADLINE_SECONDS": "0.001", "FTJOB_TERMINATION_LOG": str(tmp_path / "term")},
    )
    wait_for(
        lambda: report_step(report) >= 4 and list_steps(ckpt), timeout=120, proc=p, what="a periodic save"
    )
    os.kill(p.pid, signal.SIGTERM)
    finish(p)
    term, doc = read_json(tmp_path / "term"), read_json(report)
    assert term["exitCode"] == 75 and term["reason"] == "save-skipped-deadline", log_of(p)[-3000:]
    kept = max(list_steps(ckpt))
    assert term["checkpoint"] == str(ckpt / f"step-{kept:09d}") and kept < term["step"]
    assert "miss the" in term["message"] and "kept the last committed checkpoint" in term["message"]
    assert doc["preemption_saves"] == 0 and doc["last_checkpoint_step"] == kept
    skipped = [e for e in events_of(p) if e["event"] == "checkpoint_skipped"]
    assert sorted(e["rank"] for e in skipped) == [0, 1]
    for e in skipped:
        assert (e["step"], e["kind"], e["reason"], e["kept"]) == (
            term["step"],
            "stop",
            "deadline",
            term["checkpoint"],
        )
        assert e["deficit_s"] > 0 and e["estimate_s"] > 0
    assert not [e for e in events_of(p) if e["event"] == "checkpoint_save_started" and e["kind"] == "stop"]


def test_signal_right_after_resume_stops_without_a_second_save(procs, tmp_path):
    """A stop before the first step of a resumed run: the resumed step is already committed, nothing to save."""
    ckpt = tmp_path / "ckpt"
    args = [*TINY, "--checkpoint-dir", str(ckpt), "--termination-log", str(tmp_path / "term")]
    p = procs.start([sys.executable, "-m", "ftjob_trainer.train", *args, "--steps", "3"], name="a")
    assert finish(p) == 0
    report = tmp_path / "b.json"
    p = procs.start(
        [sys.executable, "-m", "ftjob_trainer.train", *args, "--steps", "400", "--report", str(report)],
        name="b",
    )
    # the signal handlers are installed before the process group is made: a SIGTERM now lands during startup or
    # loading, before the first step of the resumed run
    wait_for(
        lambda: any(e["event"] == "process_group_ready" for e in events_of(p)),
        timeout=120,
        proc=p,
        what="the process group",
    )
    p.send_signal(signal.SIGTERM)
    assert finish(p) == 75, log_of(p)[-3000:]
    term = read_json(tmp_path / "term")
    assert (
        term["reason"] == "preempted"
        and term["step"] == 3
        and term["checkpoint"] == str(ckpt / f"step-{term['step']:09d}")
    ), term
    assert "already committed" in term["message"]
    evs = events_of(p)
    (skipped,) = [e for e in evs if e["event"] == "checkpoint_skipped"]
    assert (skipped["step"], skipped["reason"], skipped["kept"]) == (
        3,
        "already-committed",
        term["checkpoint"],
    )
    assert not any(e["event"] in ("first_step", "checkpoint_save_started") for e in evs)
    (ev,) = [e for e in evs if e["event"] == "stop_signal"]
    assert ev["signal"] == "SIGTERM" and ev["step"] == 3
    doc = read_json(report)
    assert doc["exit_code"] == 75 and doc["preemption_saves"] == 0, doc
    assert list_steps(ckpt)[-1] == term["step"]
