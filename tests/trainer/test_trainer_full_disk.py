"""A checkpoint volume that fills up, for real: a tmpfs with room for one tiny checkpoint (22 MB) and not two.

Periodic saves that do not fit are dropped on every rank (their folders removed, the last committed one kept) and
training goes on; the final save that does not fit ends the process with an error that says the medium is full.
Given room, the same job resumes from the kept checkpoint and ends in the state of an uninterrupted run."""

from __future__ import annotations

import subprocess

import pytest
from trainer_testlib import TINY, finish, list_steps, log_of, read_json

pytestmark = pytest.mark.slow
STEPS = 8
FITS_ONE = "30m"  # one tiny checkpoint (22 MB, two ranks) fits, a second does not


@pytest.fixture
def small_volume(tmp_path):
    """A real filesystem that fills up. Mounting a tmpfs needs root (CAP_SYS_ADMIN): CI runs as root."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FITS_ONE}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def run(procs, tmp, name, args):
    p = procs.torchrun(
        [*TINY, "--steps", str(STEPS), *args, "--report", str(tmp / f"{name}.json")],
        name=name,
        env={"FTJOB_TERMINATION_LOG": str(tmp / f"{name}.term")},
    )
    return p, finish(p)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_full_disk_drops_periodic_saves_fails_the_final_one_clearly_and_loses_nothing(
    procs, tmp_path, small_volume, mode
):
    from ftjob_trainer import contract

    base, code = run(procs, tmp_path, "base", [])
    assert code == 0, log_of(base)[-3000:]
    baseline = read_json(tmp_path / "base.json")

    args = ["--checkpoint-dir", str(small_volume), "--checkpoint-every", "2"]
    if mode == "async":
        args.append("--async-checkpoint")
    full, code = run(procs, tmp_path, "full", args)
    assert code != 0, "a final save that did not fit must fail the process"
    events = contract.parse_events(log_of(full).splitlines())
    term = read_json(tmp_path / "full.term")
    assert term is not None, f"no termination message: {log_of(full)[-3000:]}"
    assert term["reason"] == "error" and term["exitCode"] == contract.EXIT_ERROR, term
    msg = term["message"]
    assert msg.startswith(f"SaveFailed: checkpoint of step {STEPS} (final) was not saved"), msg
    assert "No space left on device" in msg, msg
    assert "(full: give the checkpoint volume room for --keep-last + 1 checkpoints)" in msg, msg
    assert msg.endswith(f"the last committed one stays {small_volume}/step-000000002"), msg
    # the periodic saves that did not fit: dropped on both ranks, training went on to the last step
    failed = [
        e for e in events if e["event"] == contract.EVENT_CHECKPOINT_SKIPPED and e["reason"] == "failed"
    ]
    assert {(e["rank"], e["step"], e["kind"]) for e in failed} == {
        (r, s, k) for r in (0, 1) for s, k in ((4, "periodic"), (6, "periodic"), (STEPS, "final"))
    }, failed
    assert all("No space left on device" in e["error"] for e in failed), failed
    assert all(e["kept"] == f"{small_volume}/step-000000002" for e in failed), failed
    steps = [e["step"] for e in events if e["event"] == contract.EVENT_STEP]
    assert max(steps) == STEPS, steps
    # nothing half-written stays to fill the volume: only the kept checkpoint
    assert sorted(p.name for p in small_volume.iterdir()) == ["step-000000002"]
    assert list_steps(small_volume) == [2]

    # given room (a larger volume), the same job resumes from the kept step and ends where the baseline did
    subprocess.run(["mount", "-o", "remount,size=200m", str(small_volume)], check=True)
    resumed, code = run(procs, tmp_path, "resumed", args)
    assert code == 0, log_of(resumed)[-3000:]
    report = read_json(tmp_path / "resumed.json")
    assert report["resumed_from_step"] == 2 and report["step"] == STEPS, report
    assert report["state_sha256"] == baseline["state_sha256"]
    assert list_steps(small_volume)[-1] == STEPS
