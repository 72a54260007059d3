"""Exact resume and resharding, with the real torchrun and gloo on the CPU."""

from __future__ import annotations

import os
import signal

import pytest
from trainer_testlib import TINY, Procs, finish, log_of, read_json, report_step, wait_for

pytestmark = pytest.mark.slow
STEPS = 14


def run_to_end(procs, tmp, name, args, nproc=2):
    p = procs.torchrun(
        [*TINY, *args, "--report", str(tmp / f"{name}.json")],
        name=name,
        nproc=nproc,
        env={"FTJOB_TERMINATION_LOG": str(tmp / f"{name}.term")},
    )
    assert finish(p) == 0, log_of(p)[-4000:]
    return read_json(tmp / f"{name}.json")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """N steps uninterrupted and without any checkpoint: the reference state."""

    tmp = tmp_path_factory.mktemp("baseline")
    procs = Procs(tmp)
    try:
        return run_to_end(procs, tmp, "base", ["--steps", str(STEPS)])
    finally:
        procs.cleanup()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigterm_at_any_step_then_restart_ends_in_the_same_state(procs, tmp_path, baseline, mode):
    ckpt = tmp_path / "ckpt"
    extra = ["--steps", str(STEPS), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3"]
    if mode == "async":
        extra.append("--async-checkpoint")
    report = tmp_path / "first.json"
    stop_after = 5 if mode == "sync" else 7  # not a multiple of --checkpoint-every: the stop save is its own
    p = procs.torchrun(
        [*TINY, *extra, "--report", str(report)],
        name="first",
        env={"FTJOB_TERMINATION_LOG": str(tmp_path / "first.term")},
    )
    wait_for(lambda: report_step(report) >= stop_after, timeout=120, proc=p, what=f"step {stop_after}")
    os.killpg(p.pid, signal.SIGTERM)  # what the kubelet does: the agent forwards it to its workers
    finish(p)
    first = read_json(report)
    term = read_json(tmp_path / "first.term")
    assert first["exit_code"] == 75 and first["reason"] == "preempted", log_of(p)[-3000:]
    saved = first["step"]
    assert (
        term["step"] == saved and term["exitCode"] == 75 and term["checkpoint"].endswith(f"step-{saved:09d}")
    )
    assert first["last_checkpoint_step"] == saved and first["preemption_saves"] == 1
    assert 0 < saved < STEPS

    second = run_to_end(procs, tmp_path, "second", extra)
    assert second["resumed_from_step"] == saved
    assert second["first_step"] == saved + 1  # nothing repeated, nothing skipped
    assert second["step"] == STEPS and second["data_cursor"] == STEPS * 4
    assert second["preemption_saves"] == 1  # travels in the checkpoint
    assert second["state_sha256"] == baseline["state_sha256"]
    assert second["loss"] == baseline["loss"]


def test_resharding_2_to_1_to_2_keeps_state_and_stream(procs, tmp_path):
    """Save at world size 2, resume at 1, back at 2. The state loaded equals the state saved (hash), the data
    cursor continues, and the losses follow an uninterrupted run at world size 2 (the reduction order differs,
    so close rather than bitwise)."""
    ckpt = tmp_path / "ckpt"
    const_lr = ["--warmup-steps", "0", "--min-lr-ratio", "1"]  # a schedule independent of --steps
    common = [*const_lr, "--checkpoint-dir", str(ckpt), "--hash-on-load"]
    ref = run_to_end(procs, tmp_path, "ref", [*const_lr, "--steps", "12"])
    a = run_to_end(procs, tmp_path, "a", [*common, "--steps", "4"], nproc=2)
    b = run_to_end(procs, tmp_path, "b", [*common, "--steps", "8"], nproc=1)
    c = run_to_end(procs, tmp_path, "c", [*common, "--steps", "12"], nproc=2)
    assert (b["world_size"], c["world_size"]) == (1, 2)
    assert b["resumed_from_step"] == 4 and b["loaded_state_sha256"] == a["state_sha256"]
    assert c["resumed_from_step"] == 8 and c["loaded_state_sha256"] == b["state_sha256"]
    assert c["data_cursor"] == ref["data_cursor"] == 48
    assert c["loss"] == pytest.approx(ref["loss"], rel=1e-4)
    assert c["state_sha256"] != a["state_sha256"]  # it trained on
