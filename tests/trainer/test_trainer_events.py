"""The trainer's structured events (contract.EVENT_*): one JSON line per moment, with time, rank and pid; the
checkpointer's events in-process (a world of one), and a whole preemption story under the real torchrun."""

from __future__ import annotations

import io
import os
import signal
import time

import pytest
from engine_testlib import tiny_engine, train_step
from ftjob_trainer import contract, events
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.checkpoint_staging import STAGED_ASYNC
from trainer_testlib import TINY, events_of, finish, log_of, read_json, report_step, wait_for


def test_emit_writes_one_flushed_json_line_with_time_rank_and_pid():
    class Stream(io.StringIO):
        flushed = 0

        def flush(self):
            self.flushed += 1

    stream = Stream()
    events.set_stream(stream)
    try:
        events.set_rank(3)
        before = time.time()
        written = events.emit(contract.EVENT_FRESH_START, checkpoint_dir="/c")
    finally:
        events.set_stream(None)
        events.set_rank(None)
    (line,) = stream.getvalue().splitlines()
    assert stream.flushed == 1 and stream.getvalue().endswith("\n")
    ev = contract.parse_event(line)
    assert ev == written
    assert ev["event"] == "fresh_start" and ev["rank"] == 3 and ev["pid"] == os.getpid()
    assert ev["checkpoint_dir"] == "/c" and before <= ev["time"] <= time.time()
    with pytest.raises(ValueError, match="unknown event"):
        events.emit("no_such_moment")


def test_process_start_time_is_the_os_start_before_the_imports():
    # /proc's start time is in clock ticks: it can read up to one tick after the true start
    assert events.STARTED_AT <= events._IMPORTED_AT + 0.05
    assert time.time() - events.STARTED_AT < 24 * 3600  # this test process, not the machine's boot
    assert events.since_start() > 0


def test_checkpointer_events_save_stage_commit_load_and_reject(world_of_one, tmp_path, captured_events):
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path), keep_last=3, engine=engine, rank=0, world_size=1)
    try:
        train_step(engine, ckpt, 0)
        ckpt.save(1, {}, asynchronous=True, kind=contract.KIND_PERIODIC)
        train_step(engine, ckpt, 1)
        path = ckpt.save(2, {}, kind=contract.KIND_STOP)  # waits for the periodic one first
    finally:
        ckpt.close()
    saves = [e for e in captured_events() if e["event"].startswith("checkpoint_")]
    started = [e for e in saves if e["event"] == contract.EVENT_CHECKPOINT_SAVE_STARTED]
    assert [(e["step"], e["kind"], e["asynchronous"], e["waits_for"]) for e in started] == [
        (1, "periodic", True, None),
        (2, "stop", False, 1),
    ]
    committed = [e for e in saves if e["event"] == contract.EVENT_CHECKPOINT_COMMITTED]
    assert [(e["step"], e["kind"], e["tier"]) for e in committed] == [
        (1, "periodic", "durable"),
        (2, "stop", "durable"),
    ]
    assert committed[1]["path"] == path and committed[1]["bytes"] == sum(
        f.stat().st_size for f in (tmp_path / os.path.basename(path)).iterdir()
    )
    assert all(e["seconds"] > 0 for e in committed)
    staged = [e for e in saves if e["event"] == contract.EVENT_CHECKPOINT_STAGED]
    if (
        STAGED_ASYNC
    ):  # both saves go through the stager (the sync one waits): each is staged before it commits
        assert [e["step"] for e in staged] == [1, 2]
        for s, c in zip(staged, committed, strict=True):
            assert s["time"] <= c["time"] and s["seconds"] <= c["seconds"]

    # load: the newest is corrupt (set aside, rejected), the one before loads
    shard = next((tmp_path / os.path.basename(path)).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    fresh = tiny_engine()
    loaded = Checkpointer(str(tmp_path), keep_last=3, engine=fresh, rank=0, world_size=1).load_latest()
    assert loaded.step == 1
    rejected = [e for e in captured_events() if e["event"] == contract.EVENT_CHECKPOINT_REJECTED]
    assert [(e["step"], e["path"]) for e in rejected] == [(2, path)] and "truncated" in rejected[0]["error"]
    (ev,) = [e for e in captured_events() if e["event"] == contract.EVENT_CHECKPOINT_LOADED]
    state_bytes = sum(p.numel() * p.element_size() for p in fresh.model.state_dict().values())
    assert ev["step"] == 1 and ev["tier"] == "durable" and ev["saved_world_size"] == 1
    assert ev["bytes"] > state_bytes  # model and optimizer state (AdamW: two moments per parameter)
    assert 0 < ev["seconds"] <= ev["total_s"] and ev["gbps"] == pytest.approx(
        ev["bytes"] / ev["seconds"] / 1e9, rel=1e-2
    )


def by_rank(evs: list[dict], name: str) -> dict:
    out: dict = {}
    for e in evs:
        if e["event"] == name:
            out.setdefault(e["rank"], []).append(e)
    return out


@pytest.mark.slow
def test_a_preemption_and_its_resume_emit_every_moment(procs, tmp_path):
    """SIGTERM to torchrun with async periodic saves, then a fresh torchrun on the same directory."""
    ckpt = tmp_path / "ckpt"
    args = [
        *TINY,
        "--steps",
        "14",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "3",
        "--async-checkpoint",
    ]
    report = tmp_path / "first.json"
    env = {"FTJOB_TERMINATION_LOG": str(tmp_path / "term")}
    p = procs.torchrun([*args, "--report", str(report)], name="first", env=env)
    wait_for(lambda: report_step(report) >= 7, timeout=120, proc=p, what="step 7")
    os.killpg(p.pid, signal.SIGTERM)
    assert finish(p) != 0
    first = events_of(p)
    saved = read_json(report)["step"]

    for rank in (0, 1):
        names = [e["event"] for e in first if e["rank"] == rank]
        assert names[:4] == ["process_started", "process_group_ready", "model_built", "fresh_start"], names
        assert names[-1] == "exit" and "first_step" in names
        assert names.index("stop_signal") < names.index("stop_agreed") < names.index("exit")
    started = by_rank(first, "process_started")
    assert {r: e[0]["restart_count"] for r, e in started.items()} == {0: 0, 1: 0}
    assert all(e[0]["started_at"] <= e[0]["time"] for e in started.values())
    assert {e["world_size"] for e in by_rank(first, "process_group_ready")[1]} == {2}
    signal_ev = by_rank(first, "stop_signal")
    assert sorted(signal_ev) == [0, 1]
    for (ev,) in signal_ev.values():
        assert ev["signal"] == "SIGTERM" and ev["signal_time"] <= ev["time"] and ev["since_signal_s"] >= 0
    agreed = by_rank(first, "stop_agreed")
    assert {e[0]["step"] for e in agreed.values()} == {saved}
    assert {e[0]["reason"] for e in agreed.values()} == {"preempted"}
    commits = by_rank(first, "checkpoint_committed")
    assert list(commits) == [0], "only rank 0 commits"
    kinds = [(e["step"], e["kind"]) for e in commits[0]]
    assert kinds[-1] == (saved, "stop") and (3, "periodic") in kinds and (6, "periodic") in kinds
    assert by_rank(first, "step")[0][0]["step"] == 1 and list(by_rank(first, "step")) == [0]
    (exit0,) = by_rank(first, "exit")[0]
    assert (exit0["code"], exit0["reason"], exit0["step"]) == (75, "preempted", saved)

    p2 = procs.torchrun([*args, "--report", str(tmp_path / "second.json")], name="second", env=env)
    assert finish(p2) == 0, log_of(p2)[-3000:]
    second = events_of(p2)
    loaded = by_rank(second, "checkpoint_loaded")
    assert sorted(loaded) == [0, 1]
    for (ev,) in loaded.values():
        assert ev["step"] == saved and ev["tier"] == "durable" and ev["bytes"] > 0 and ev["gbps"] > 0
    for (ev,) in by_rank(second, "first_step").values():
        assert ev["step"] == saved + 1 and ev["seconds"] > 0
    assert "fresh_start" not in {e["event"] for e in second}
    (final,) = [e for e in by_rank(second, "checkpoint_committed")[0] if e["kind"] == "final"]
    assert final["step"] == 14
    assert {(e[0]["code"], e[0]["reason"]) for e in by_rank(second, "exit").values()} == {(0, "done")}


def test_process_start_time_is_not_before_the_process_was_spawned():
    # /proc/stat's btime has whole seconds and put starts up to 1 s early; /proc/uptime has centiseconds
    import subprocess
    import sys

    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "from ftjob_trainer import events; print(repr(events.STARTED_AT))"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    started = float(out.stdout)
    assert before - 0.05 <= started <= time.time(), (before, started)
