"""A checkpoint volume that fills up, for real: a tmpfs with room for one tiny checkpoint (22 MB) and not two.

Periodic saves that do not fit are dropped on every rank (their folders removed, the last committed one kept) and
training goes on; the final save that does not fit ends the process with an error that says the medium is full.
Given room, the same job resumes from the kept checkpoint and ends in the state of an uninterrupted run."""

from __future__ import annotations

import errno
import os

import pytest
from support.tmpfs import grow, small_tmpfs
from trainer_testlib import TINY, finish, list_steps, log_of, read_json

pytestmark = pytest.mark.slow
STEPS = 8
FITS_ONE = "30m"  # one tiny checkpoint (22 MB, two ranks) fits, a second does not


@pytest.fixture
def small_volume(tmp_path):
    with small_tmpfs(tmp_path / "ckpt", FITS_ONE) as folder:
        yield folder


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
    # the error itself varies with the write that hit the full disk (torch.save's zip writer says RuntimeError)
    assert "(full: give the checkpoint volume room for --keep-last + 1 checkpoints)" in msg, msg
    assert msg.endswith(f"the last committed one stays {small_volume}/step-000000002"), msg
    # the periodic saves that did not fit: dropped on both ranks, training went on to the last step
    failed = [
        e for e in events if e["event"] == contract.EVENT_CHECKPOINT_SKIPPED and e["reason"] == "failed"
    ]
    assert {(e["rank"], e["step"], e["kind"]) for e in failed} == {
        (r, s, k) for r in (0, 1) for s, k in ((4, "periodic"), (6, "periodic"), (STEPS, "final"))
    }, failed
    assert all("(full: give the checkpoint volume" in e["error"] for e in failed), failed
    assert all(e["kept"] == f"{small_volume}/step-000000002" for e in failed), failed
    steps = [e["step"] for e in events if e["event"] == contract.EVENT_STEP]
    assert max(steps) == STEPS, steps
    # the report (and so the coordinator: the job's CheckpointFailing condition) names the newest dropped save
    dropped = read_json(tmp_path / "full.json")["last_checkpoint_failure"]
    assert (dropped["step"], dropped["kind"], dropped["kept"]) == (
        6,
        "periodic",
        f"{small_volume}/step-000000002",
    )
    assert dropped["message"].startswith("checkpoint of step 6 (periodic) was not saved"), dropped
    # nothing half-written stays to fill the volume: only the kept checkpoint
    assert sorted(p.name for p in small_volume.iterdir()) == ["step-000000002"]
    assert list_steps(small_volume) == [2]

    # given room (a larger volume), the same job resumes from the kept step and ends where the baseline did
    grow(small_volume, "200m")
    resumed, code = run(procs, tmp_path, "resumed", args)
    assert code == 0, log_of(resumed)[-3000:]
    report = read_json(tmp_path / "resumed.json")
    assert report["resumed_from_step"] == 2 and report["step"] == STEPS, report
    assert report["state_sha256"] == baseline["state_sha256"]
    assert list_steps(small_volume)[-1] == STEPS


def _no_space(*_args, **_kwargs):
    """The OS's error where the commit record is written: the disk is full."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("kind", ["periodic", "final"])
def test_a_commit_record_that_does_not_fit_is_dropped_or_fails_clearly(
    world_of_one, tmp_path, captured_events, kind
):
    """The shards fit, the commit record (ftjob.json, rank 0's alone) does not: in a world of several ranks the
    others learn it in the same collective. Here the OS's error is raised where the record is written."""
    from engine_testlib import tiny_engine, train_step
    from ftjob_trainer import contract
    from ftjob_trainer.checkpoint import Checkpointer
    from ftjob_trainer.checkpoint_layout import list_committed
    from ftjob_trainer.checkpoint_save import SaveFailed

    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path), keep_last=2, engine=engine, rank=0, world_size=1)
    try:
        train_step(engine, ckpt, 0)
        assert ckpt.save(1, {}) is not None
        train_step(engine, ckpt, 1)
        real = ckpt.store.commit
        ckpt.store.commit = _no_space
        if kind == "periodic":
            assert ckpt.save(2, {}) is None, "a periodic save that did not fit is dropped"
        else:
            with pytest.raises(SaveFailed, match=r"checkpoint of step 2 \(final\) was not saved: OSError"):
                ckpt.save(2, {}, kind=contract.KIND_FINAL, durable_now=True)
        ckpt.store.commit = real
        assert [s for s, _ in list_committed(str(tmp_path))] == [1]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000001"], (
            "the failed save's folder must go"
        )
        skipped = [e for e in captured_events() if e["event"] == contract.EVENT_CHECKPOINT_SKIPPED]
        assert [(e["step"], e["kind"], e["reason"]) for e in skipped] == [(2, kind, "failed")]
        assert "No space left on device" in skipped[0]["error"] and "(full: " in skipped[0]["error"]
        dropped = ckpt.take_failures()  # what the reporter hands the coordinator; a final save raised instead
        assert [(f.step, f.kind, f.kept) for f in dropped] == (
            [(2, "periodic", f"{tmp_path}/step-000000001")] if kind == "periodic" else []
        )
        train_step(engine, ckpt, 2)  # the next save, with room, commits
        assert ckpt.save(3, {}) is not None
        assert [s for s, _ in list_committed(str(tmp_path))] == [3, 1]
    finally:
        ckpt.close()


def test_a_final_save_that_fails_still_reports_the_save_dropped_before_it(world_of_one, tmp_path):
    """A stop or final save first finishes the async save in flight (drain()); when that one was dropped and the
    stop or final save then fails too, the error path must still hand the dropped save to the report (and so to
    the operator's CheckpointFailing condition). CI once saw the report name an older dropped save instead."""
    from types import SimpleNamespace

    from engine_testlib import tiny_engine, train_step
    from ftjob_trainer import contract, train
    from ftjob_trainer.checkpoint import Checkpointer
    from ftjob_trainer.checkpoint_save import SaveFailed
    from ftjob_trainer.config import parse_args
    from ftjob_trainer.reporting import Reporter

    cfg = parse_args(["--report", str(tmp_path / "report.json")], env={})
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path / "ckpt"), keep_last=2, engine=engine, rank=0, world_size=1)
    report = Reporter(cfg, 0, 1)
    try:
        train_step(engine, ckpt, 0)
        assert ckpt.save(1, {}) is not None
        report.take_commits(ckpt)
        train_step(engine, ckpt, 1)
        ckpt.store.commit = _no_space
        assert ckpt.save(2, {}) is None  # dropped, not yet handed on: as when drain() found it
        with pytest.raises(SaveFailed) as failed:
            ckpt.save(3, {}, kind=contract.KIND_FINAL, durable_now=True)
        trainer = SimpleNamespace(report=report, ckpt=ckpt, step=3, rank=0)
        train._report_error(cfg, trainer, contract.EXIT_ERROR, str(failed.value))
    finally:
        ckpt.close()
    doc = read_json(tmp_path / "report.json")
    assert doc["exit_code"] == contract.EXIT_ERROR and doc["error"].startswith("checkpoint of step 3 (final)")
    assert doc["last_checkpoint_step"] == 1, doc
    dropped = doc["last_checkpoint_failure"]
    assert (dropped["step"], dropped["kind"], dropped["kept"]) == (
        2,
        "periodic",
        f"{tmp_path}/ckpt/step-000000001",
    )


def test_a_shard_write_that_hits_a_full_disk_says_so_on_every_rank(tmp_path):
    """torch.save's zip writer turns a full disk's OSError into "RuntimeError: ... unexpected pos", and DCP hands
    each rank's error to the others pickled, without that context: only the rank that wrote could tell. The
    writer says ENOSPC itself, so a peer's report has the full-disk hint whatever the medium holds by then (CI
    once saw it missing: rank 0 had freed its files before the other rank looked)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from ftjob_trainer.checkpoint_save import _by_rank, report_failure
    from ftjob_trainer.shard_io import RecordingWriter

    with small_tmpfs(tmp_path / "volume", "1m") as volume:
        (volume / "filler").write_bytes(b"x" * (700 << 10))  # 300 KiB left, for a 2 MiB shard
        with pytest.raises(BaseException) as raised:  # DCP's CheckpointException is a BaseException
            writer = RecordingWriter(str(volume), sync_files=True, thread_count=1)
            dcp.save({"w": torch.zeros(512 << 10)}, storage_writer=writer, no_dist=True)
        errors = [exc for _, exc in _by_rank(raised.value)]
        assert [getattr(exc, "errno", None) for exc in errors] == [errno.ENOSPC], errors
        # medium=None: the hint comes from the error alone, as on a rank that reads the medium too late
        failure = report_failure(5, "periodic", raised.value, None, None, "give it room")
    assert "(full: give it room)" in failure.message, failure.message


def _rank_whose_commit_record_does_not_fit(rank: int, init_file: str, ckpt_dir: str, out: str) -> None:
    """One of two ranks (gloo, this machine): rank 0's commit record of step 2 does not fit."""
    import json

    import torch.distributed as dist
    from engine_testlib import tiny_engine, train_step
    from ftjob_trainer.checkpoint import Checkpointer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    engine = tiny_engine()
    ckpt = Checkpointer(ckpt_dir, keep_last=2, engine=engine, rank=rank, world_size=2)
    got = []
    for step in (1, 2, 3):
        train_step(engine, ckpt, step - 1)
        real = ckpt.store.commit
        if rank == 0 and step == 2:
            ckpt.store.commit = _no_space
        got.append(ckpt.save(step, {}))
        ckpt.store.commit = real
    ckpt.close()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(got, f)


def test_two_ranks_both_drop_a_save_whose_commit_record_failed_on_rank_0(tmp_path):
    """Rank 0 alone fails to write the record; rank 1 must not wait for it in a collective (it did: the save's
    closing barrier, while rank 0 went on to the next step's): both drop step 2 and both commit step 3."""
    import json
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ckpt = tmp_path / "ckpt"
    args = (str(tmp_path / "init"), str(ckpt), str(tmp_path))
    ranks = [ctx.Process(target=_rank_whose_commit_record_does_not_fit, args=(r, *args)) for r in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(120)
    hung = [r for r, p in enumerate(ranks) if p.is_alive()]
    for p in ranks:
        p.kill()
    assert not hung, f"ranks {hung} still waiting after 120 s: a rank was left in a collective"
    assert [p.exitcode for p in ranks] == [0, 0]
    step = [f"{ckpt}/step-{s:09d}" for s in (1, 3)]
    for r in (0, 1):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == [step[0], None, step[1]]
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-000000001", "step-000000003"]


def _rank_whose_async_memory_marker_does_not_fit(rank: int, init_file: str, root: str, out: str) -> None:
    """One of two ranks with a memory tier: rank 1's marker of the async save of step 2 does not fit (its
    /dev/shm filled up after DCP wrote). Each rank finishes an async save at its own poll()."""
    import json
    import time

    import torch.distributed as dist
    from engine_testlib import tiny_engine, train_step
    from ftjob_trainer import contract, memory_tier
    from ftjob_trainer.checkpoint import Checkpointer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    engine = tiny_engine()
    shm = os.path.join(root, f"shm{rank}")  # each rank its own pod's memory
    ckpt = Checkpointer(
        os.path.join(root, "ckpt"), keep_last=2, engine=engine, rank=rank, world_size=2, memory_root=shm
    )
    real = memory_tier.write_marker
    if rank == 1:
        memory_tier.write_marker = lambda path, *a, durable, **k: (
            _no_space() if not durable and "step-000000002" in path else real(path, *a, durable=durable, **k)
        )
    train_step(engine, ckpt, 0)
    ckpt.save(1, {})  # memory-committed; its durable copy follows
    train_step(engine, ckpt, 1)
    ckpt.save(2, {}, asynchronous=True)
    while ckpt.inflight is not None:  # each rank finishes it alone: rank 1 drops it, rank 0 memory-commits it
        ckpt.poll()
        time.sleep(0.01)
    memory_tier.write_marker = real
    train_step(engine, ckpt, 2)
    third = ckpt.save(3, {})
    final = ckpt.save(4, {}, kind=contract.KIND_FINAL, durable_now=True)
    failures = [(f.step, f.kind, f.message) for f in ckpt.take_failures()]
    ckpt.close()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"third": third, "final": final, "failures": failures}, f)


def test_an_async_save_one_rank_dropped_alone_is_dropped_by_every_rank(tmp_path):
    """Rank 1 alone drops the async save of step 2. Rank 0 memory-committed it and would have waited for rank 1's
    durable copy forever (its next save waits for that copy, rank 1 in the save's collective: a hang); now every rank
    drops step 2 at the next save, rank 0 reports it, and steps 3 and 4 commit."""
    import json
    import multiprocessing
    import time

    from ftjob_trainer.checkpoint_layout import list_committed

    ctx = multiprocessing.get_context("spawn")
    args = (str(tmp_path / "init"), str(tmp_path), str(tmp_path))
    ranks = [
        ctx.Process(target=_rank_whose_async_memory_marker_does_not_fit, args=(r, *args)) for r in (0, 1)
    ]
    for p in ranks:
        p.start()
    deadline = time.monotonic() + 120
    for p in ranks:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(ranks) if p.is_alive()]
    for p in ranks:
        p.kill()
    assert not hung, f"ranks {hung} still waiting after 120 s: a rank was left in a collective"
    assert [p.exitcode for p in ranks] == [0, 0]
    ckpt = tmp_path / "ckpt"
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [g["final"] for g in got] == [f"{ckpt}/step-000000004"] * 2, got
    assert [s for s, _ in list_committed(str(ckpt))][0] == 4
    assert not (ckpt / ".tmp-step-000000002").exists(), sorted(p.name for p in ckpt.iterdir())
    # each rank says so: rank 1 why, rank 0 that another rank could not finish it
    assert [(s, k) for s, k, _ in got[0]["failures"]] == [(2, "periodic")], got[0]
    assert "another rank could not finish its part" in got[0]["failures"][0][2], got[0]
    assert [(s, k) for s, k, _ in got[1]["failures"]] == [(2, "periodic")], got[1]
    assert "No space left on device" in got[1]["failures"][0][2], got[1]
