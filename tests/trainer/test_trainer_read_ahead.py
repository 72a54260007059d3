"""ftjob_trainer.read_ahead: once a round forms, the launcher's agent reads the checkpoint its workers will load into
the page cache (a job of one node: from the launcher's start). What it picks (the newest committed checkpoint, this
node's share of its shards, nothing while a newer save is only in memory), a read begun before the round giving way
to a newer save, and the launcher doing it between two real runs of the trainer."""

from __future__ import annotations

import json
import os

import pytest
from engine_testlib import tiny_engine, train_step
from ftjob_trainer import read_ahead
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.checkpoint_layout import committed_name, dir_bytes, list_committed
from ftjob_trainer.checkpoint_layout import tmp_path as save_in_progress
from ftjob_trainer.torchrun_args import most_nodes
from trainer_testlib import TINY, events_of, finish, log_of


def fake_checkpoint(root, step: int, world_size: int, files_per_rank: int = 2) -> str:
    """A committed folder with the names a save of `world_size` ranks leaves (DCP's __<rank>_<n>.distcp, a side
    file of rank 0, each rank's RNG state, .metadata, ftjob.json), each file 10 bytes."""
    path = root / committed_name(step)
    path.mkdir(parents=True)
    names = [".metadata", "__0_replicated_0.distcp"]
    for r in range(world_size):
        names += [f"__{r}_{n}.distcp" for n in range(files_per_rank)] + [f"rng-rank{r}.pt"]
    for name in names:
        (path / name).write_bytes(b"x" * 10)
    (path / "ftjob.json").write_text(json.dumps({"step": step, "world_size": world_size}))
    return str(path)


def shard_ranks(p: read_ahead.Plan) -> set[int]:
    """The old ranks whose own shards (not side files) the plan reads."""
    found = ((read_ahead.RANK_FILE_RE.match(n), n) for n in p.files)
    return {int(m.group(1)) for m, name in found if m and read_ahead.SIDE_MARK not in name}


def test_a_node_reads_the_shards_its_share_of_the_world_loads_and_every_shared_file(tmp_path):
    fake_checkpoint(tmp_path, 10, world_size=4)
    path = fake_checkpoint(tmp_path, 20, world_size=4)
    whole = read_ahead.plan(str(tmp_path), 0, 1)
    assert whole is not None and (whole.step, whole.path) == (20, path)  # the newest committed one
    assert sorted(whole.files) == sorted(os.listdir(path)) and whole.bytes == dir_bytes(path)
    # two nodes: each reads the shards of two of the four old ranks, and every file no rank prefix names
    second = read_ahead.plan(str(tmp_path), 1, 2)
    assert shard_ranks(second) == {2, 3}
    assert {".metadata", "ftjob.json", "__0_replicated_0.distcp", "rng-rank0.pt"} <= set(second.files)
    # four old ranks on three nodes: a node reads every old rank whose rows overlap its third
    assert [shard_ranks(read_ahead.plan(str(tmp_path), g, 3)) for g in range(3)] == [{0, 1}, {1, 2}, {2, 3}]
    # eight nodes where four ranks saved: two nodes read each old rank
    assert [shard_ranks(read_ahead.plan(str(tmp_path), g, 8)) for g in range(8)] == [
        {r} for r in (0, 0, 1, 1, 2, 2, 3, 3)
    ]


def test_nothing_to_read_without_a_committed_checkpoint_or_under_a_newer_memory_only_save(tmp_path):
    assert read_ahead.plan(str(tmp_path / "absent"), 0, 1) is None
    fake_checkpoint(tmp_path, 20, world_size=1)
    newer = tmp_path / os.path.basename(save_in_progress(str(tmp_path), 24))
    newer.mkdir()
    (newer / "ftjob.json").write_text("{}")  # memory-committed: survivors load it from their memory tier
    assert read_ahead.plan(str(tmp_path), 0, 1) is None
    (newer / "ftjob.json").unlink()  # a save still in progress is no checkpoint: the committed one is read
    assert read_ahead.plan(str(tmp_path), 0, 1).step == 20


def test_the_launcher_reads_the_most_nodes_from_torchruns_flags():
    program = ["-m", "ftjob_trainer.train", "--nnodes=4"]  # the program's own flags are not torchrun's
    assert most_nodes(["--standalone", "--nproc-per-node=2", *program]) == 1  # torchrun's default
    assert most_nodes(["--nnodes=1:1", *program]) == 1
    assert most_nodes(["--nnodes=1:3", *program]) == 3
    assert most_nodes(["--nnodes=2", *program]) == 2
    assert most_nodes(["--nnodes", "1", *program]) is None  # the operator renders --flag=value; no guess
    assert most_nodes(["--nnodes=one", *program]) is None


def test_a_read_begun_before_the_round_gives_way_to_a_newer_save(tmp_path):
    path = fake_checkpoint(tmp_path, 20, world_size=2)
    names = sorted(os.listdir(path))
    assert read_ahead.newer_save(str(tmp_path), 20) is False
    # every file is read while nothing newer appears
    assert read_ahead.read_files(path, names, 2, read_ahead.NewerSave(str(tmp_path), 20)) == dir_bytes(path)
    # a save in progress (its folder, no ftjob.json yet) stops the read before its next chunk
    os.mkdir(save_in_progress(str(tmp_path), 24))
    assert read_ahead.newer_save(str(tmp_path), 20) and not read_ahead.newer_save(str(tmp_path), 24)
    assert read_ahead.read_files(path, names, 2, read_ahead.NewerSave(str(tmp_path), 20)) == 0


def test_one_node_reads_before_its_round_unless_a_save_is_in_progress_and_not_twice(
    tmp_path, captured_events
):
    def read(reader: read_ahead.ReadAhead, start) -> list[dict]:
        seen = len(captured_events())
        start()
        reader.thread.join(30)
        assert not reader.thread.is_alive()
        return [e for e in captured_events()[seen:] if e["event"] == "read_ahead_done"]

    path = fake_checkpoint(tmp_path, 20, world_size=2)
    reader = read_ahead.ReadAhead(str(tmp_path), 2)
    (early,) = read(reader, reader.before_round)
    assert (early["step"], early["bytes"], early["before_round"], early["stopped"]) == (
        20,
        dir_bytes(path),
        True,
        False,
    )
    # the round of one node needs the same files: read already, not again
    assert read(reader, lambda: reader.round_formed(0, 1)) == []
    # a save in progress: a launcher starting now reads nothing before its round; the round reads what commits
    fresh = read_ahead.ReadAhead(str(tmp_path), 2)
    os.mkdir(save_in_progress(str(tmp_path), 24))
    assert read(fresh, fresh.before_round) == []
    os.rmdir(save_in_progress(str(tmp_path), 24))
    newer = fake_checkpoint(tmp_path, 24, world_size=2)
    (late,) = read(fresh, lambda: fresh.round_formed(0, 1))
    assert (late["step"], late["bytes"], late["before_round"]) == (24, dir_bytes(newer), False)


def test_a_real_save_names_its_shards_by_rank_and_a_read_reads_every_byte(world_of_one, tmp_path):
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path), keep_last=2, engine=engine, rank=0, world_size=1, write_threads=3)
    train_step(engine, ckpt, 0)
    ckpt.save(1, {})
    ((_, path),) = list_committed(str(tmp_path))
    shards = [n for n in os.listdir(path) if n.endswith(".distcp")]
    assert len(shards) >= 3 and all(read_ahead.RANK_FILE_RE.match(n)[1] == "0" for n in shards), shards
    p = read_ahead.plan(str(tmp_path), 0, 1)
    assert sorted(p.files) == sorted(os.listdir(path))
    assert read_ahead.read_files(p.path, p.files, threads=2) == p.bytes == dir_bytes(path)


def test_only_the_built_in_trainers_local_checkpoint_folder_is_read_ahead(tmp_path, monkeypatch):
    monkeypatch.delenv("FTJOB_CHECKPOINT_DIR", raising=False)
    assert read_ahead.checkpoint_source(
        ["--checkpoint-dir", str(tmp_path), "--checkpoint-read-threads", "3"]
    ) == (
        str(tmp_path),
        3,
    )
    monkeypatch.setenv("FTJOB_CHECKPOINT_DIR", str(tmp_path))  # the operator's pods say it in the environment
    assert read_ahead.checkpoint_source([]) == (str(tmp_path), 8)
    assert (
        read_ahead.checkpoint_source(["--checkpoint-dir", "s3://bucket/job"]) is None
    )  # no page cache to fill
    assert read_ahead.checkpoint_source(["--no-such-flag"]) is None  # the worker says what is wrong
    monkeypatch.delenv("FTJOB_CHECKPOINT_DIR")
    assert read_ahead.checkpoint_source([]) is None


@pytest.mark.slow
def test_a_restarted_launcher_reads_ahead_the_checkpoint_its_workers_then_load(procs, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [*TINY, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3"]
    first = procs.launch([*args, "--steps", "6"], name="first")
    assert finish(first) == 0, log_of(first)[-3000:]
    assert not [e for e in events_of(first) if e["event"] == "read_ahead_done"]  # nothing saved yet
    ((step, path),) = list_committed(str(ckpt))[:1]

    second = procs.launch([*args, "--steps", "9"], name="second")
    assert finish(second) == 0, log_of(second)[-3000:]
    evs = events_of(second)
    (done,) = [e for e in evs if e["event"] == "read_ahead_done"]  # its round did not read it again
    loaded = [e for e in evs if e["event"] == "checkpoint_loaded"]
    assert loaded and {e["step"] for e in loaded} == {done["step"]} == {step}, (done, loaded)
    # a job of one node (--standalone): read from the launcher's start, before its agent's imports and round
    (ready,) = [e for e in evs if e["event"] == "launcher_ready"]
    assert done["before_round"] and not done["stopped"], done
    started = done["time"] - done["seconds"]
    assert started < ready["time"], (done, ready)
    # one node holds the whole world: it read every file of the checkpoint, once
    assert (done["files"], done["bytes"]) == (len(os.listdir(path)), dir_bytes(path)), done

    off = procs.launch([*args, "--steps", "12"], name="off", env={read_ahead.ENV_READ_AHEAD: "0"})
    assert finish(off) == 0, log_of(off)[-3000:]
    assert not [e for e in events_of(off) if e["event"] == "read_ahead_done"]
