"""Crash safety of checkpoints: a SIGKILL in the middle of a save, a corrupted newest checkpoint, retention
across restarts. The trainer runs for real under torchrun (2 ranks, gloo)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from trainer_testlib import TINY, Procs, events_of, finish, kill_tree, list_steps, log_of, read_json

pytestmark = pytest.mark.slow


def run(procs, tmp, name, args, nproc=2):
    p = procs.torchrun(
        [*TINY, *args, "--report", str(tmp / f"{name}.json")],
        name=name,
        nproc=nproc,
        env={"FTJOB_TERMINATION_LOG": str(tmp / f"{name}.term")},
    )
    return p


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_chosen(procs, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = ["--steps", "400", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--keep-last", "3"]
    for attempt in range(5):  # a save lasts ~0.1 s; if the kill lands just after a commit, try the next save
        p = run(procs, tmp_path, f"killed{attempt}", args)
        caught = None
        deadline = time.monotonic() + 120
        while caught is None and p.poll() is None and time.monotonic() < deadline:
            tmps = [n for n in os.listdir(ckpt)] if ckpt.is_dir() else []
            tmps = [n for n in tmps if n.startswith(".tmp-step-")]
            if tmps and list_steps(ckpt):  # a save in progress while an older one is committed
                kill_tree(p.pid)  # the agent and both workers at once, mid-save
                caught = tmps[0]
            time.sleep(0.001)
        p.wait(timeout=30)
        assert caught, f"no save observed:\n{log_of(p)[-3000:]}"
        step = int(caught.rsplit("-", 1)[1])
        if step not in list_steps(ckpt):
            break  # killed before the commit: the case under test
    else:
        pytest.skip("every kill landed after a commit; the machine is too fast for this probe")
    assert (ckpt / caught).is_dir(), "the half-written save is still there, uncommitted"
    previous = max(list_steps(ckpt))
    assert previous < step

    p = run(
        procs,
        tmp_path,
        "resumed",
        ["--steps", str(previous + 3), "--checkpoint-dir", str(ckpt), "--keep-last", "3"],
    )
    assert finish(p) == 0, log_of(p)[-3000:]
    doc = read_json(tmp_path / "resumed.json")
    assert doc["resumed_from_step"] == previous and doc["step"] == previous + 3
    assert {(e["rank"], e["step"]) for e in events_of(p) if e["event"] == "checkpoint_loaded"} == {
        (0, previous),
        (1, previous),
    }
    # the half-written save (a step the resumed run never saves: it saves only its last step): removed at the start
    assert step != previous + 3 and not (ckpt / caught).exists()
    assert not any(n.startswith(".tmp-step-") for n in os.listdir(ckpt))


def _truncate_a_shard(path: Path) -> Path:
    shard = sorted(path.glob("*.distcp"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    return shard


def _garble_metadata(path: Path) -> Path:
    (path / ".metadata").write_bytes(b"not a pickle")
    return path / ".metadata"


def _garble_rank1_rng(path: Path) -> Path:
    # passes validate() (present, not empty) and fails on rank 1 only: the ranks must still fall back together
    (path / "rng-rank1.pt").write_bytes(b"not a torch file")
    return path / "rng-rank1.pt"


def _drop_rank1_rng(path: Path) -> Path:
    (path / "rng-rank1.pt").unlink()
    return path / "rng-rank0.pt"


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory) -> Path:
    """Steps 2, 4 and 6 committed (keep-last 3), saved once for the corruption cases: each damages its own copy."""
    tmp = tmp_path_factory.mktemp("six-steps")
    procs = Procs(tmp)
    try:
        args = [
            "--steps",
            "6",
            "--checkpoint-dir",
            str(tmp / "ckpt"),
            "--checkpoint-every",
            "2",
            "--keep-last",
            "3",
        ]
        p = run(procs, tmp, "a", args)
        assert finish(p) == 0, log_of(p)[-3000:]
    finally:
        procs.cleanup()
    assert list_steps(tmp / "ckpt") == [2, 4, 6]
    return tmp / "ckpt"


@pytest.mark.parametrize(
    "corrupt",
    [_truncate_a_shard, _garble_metadata, _garble_rank1_rng, _drop_rank1_rng],
    ids=["truncated-shard", "bad-metadata", "rank1-rng-garbled", "rank1-rng-missing"],
)
def test_corrupted_newest_is_skipped_kept_as_evidence_and_retention_survives_restart(
    procs, tmp_path, six_steps, corrupt
):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(six_steps, ckpt)
    assert list_steps(ckpt) == [2, 4, 6]
    damaged = corrupt(ckpt / "step-000000006")

    # a restart with fewer kept: loads 4, sets 6 aside, saves 6, 8, 10 and keeps the newest 2 committed
    p = run(
        procs,
        tmp_path,
        "b",
        ["--steps", "10", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--keep-last", "2"],
    )
    assert finish(p) == 0, log_of(p)[-3000:]
    evs = events_of(p)
    rejected = [(e["rank"], e["step"], e["path"]) for e in evs if e["event"] == "checkpoint_rejected"]
    assert sorted(rejected) == [(r, 6, str(ckpt / "step-000000006")) for r in (0, 1)], rejected
    loaded = [(e["rank"], e["step"]) for e in evs if e["event"] == "checkpoint_loaded"]
    assert sorted(loaded) == [(0, 4), (1, 4)]  # both ranks fell back together
    assert read_json(tmp_path / "b.json")["resumed_from_step"] == 4
    assert list_steps(ckpt) == [8, 10]
    evidence = [n for n in os.listdir(ckpt) if n.startswith("failed-step-000000006-")]
    assert len(evidence) == 1 and (ckpt / evidence[0] / damaged.name).exists()


def test_nothing_loadable_refuses_to_start_fresh(procs, tmp_path):
    ckpt = tmp_path / "ckpt"
    p = run(procs, tmp_path, "a", ["--steps", "2", "--checkpoint-dir", str(ckpt)], nproc=1)
    assert finish(p) == 0
    _garble_metadata(ckpt / "step-000000002")
    p = run(procs, tmp_path, "b", ["--steps", "4", "--checkpoint-dir", str(ckpt)], nproc=1)
    assert finish(p) != 0
    term = read_json(tmp_path / "b.term")
    assert (
        term["exitCode"] == 1 and term["reason"] == "error" and "refusing to start fresh" in term["message"]
    )
    report = read_json(tmp_path / "b.json")  # the report says how it ended, an error too
    assert report["exit_code"] == 1 and report["reason"] == "error", report
    assert "refusing to start fresh" in report["error"]
