"""The memory tier's files: which rank folders a pod holds for a save (marker of that save, files intact), the
durable copy with its per-rank markers, the commit only once every rank is durable, and cancelling."""

from __future__ import annotations

import os

import pytest
from ftjob_trainer import memory_tier as mt


def put(root, step, rank, save_id, files: dict[str, bytes]) -> str:
    folder = mt.rank_dir(str(root), step, rank)
    os.makedirs(folder)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    sizes = {n: len(d) for n, d in files.items()}
    mt.write_marker(os.path.join(folder, mt.FILES_MARKER), save_id, step, rank, sizes, durable=False)
    return folder


def test_held_takes_only_intact_folders_of_this_save(tmp_path):
    put(tmp_path, 5, 0, "a", {"__0_0.distcp": b"x" * 10, "rng-rank0.pt": b"r"})
    put(tmp_path, 5, 1, "b", {"__1_0.distcp": b"y" * 10})  # another save of step 5
    short = put(tmp_path, 5, 2, "a", {"__2_0.distcp": b"z" * 10})
    with open(os.path.join(short, "__2_0.distcp"), "wb") as f:
        f.write(b"z")  # truncated after sealing
    os.makedirs(mt.rank_dir(str(tmp_path), 5, 3))  # no marker: never sealed
    got = mt.held(str(tmp_path), 5, "a")
    assert [rf.rank for rf in got] == [0]
    assert mt.memory_files(got) == {"__0_0.distcp": got[0].path, "rng-rank0.pt": got[0].path}
    assert mt.held(str(tmp_path), 6, "a") == [] and mt.held(None, 5, "a") == []


def test_prune_keeps_only_the_named_steps(tmp_path):
    for step in (3, 5, 7):
        put(tmp_path, step, 0, "s", {"f": b"1"})
    mt.prune(str(tmp_path), keep={5})
    assert sorted(os.listdir(tmp_path)) == ["step-000000005"]


def test_durable_copy_marks_each_rank_and_commits_once_every_needed_file_is_durable(tmp_path):
    memory, durable = tmp_path / "mem", tmp_path / "tmp-step"
    durable.mkdir()
    put(memory, 4, 0, "s", {"__0_0.distcp": os.urandom(3 << 20), "rng-rank0.pt": b"r0"})
    commits = []
    needed = {"__0_0.distcp": 3 << 20, "rng-rank0.pt": 2, "__1_0.distcp": 1}  # rank 1's shard: another pod's
    copy = mt.DurableCopy(
        str(durable),
        "s",
        4,
        folders=mt.held(str(memory), 4, "s"),
        threads=4,
        needed=needed,
        commit=lambda: commits.append(1) or "committed",
    )
    # rank 0's files become durable; the commit waits for rank 1 (another pod that wrote straight to durable)
    while not copy.own_files_durable():
        assert not copy.done(), copy.result()
        copy.thread.join(0.05)
    assert not copy.done() and commits == []
    assert (durable / "__0_0.distcp").read_bytes() == (
        memory / "step-000000004/rank-0/__0_0.distcp"
    ).read_bytes()
    assert set(mt.durable_markers(str(durable), "s")) == {0}
    (durable / "__1_0.distcp").write_bytes(b"1")
    mt.write_marker(str(durable / mt.durable_marker(1)), "s", 4, 1, {"__1_0.distcp": 1}, durable=True)
    assert copy.result(timeout=30) == "committed" and commits == [1]
    assert mt.durable_sizes(mt.durable_markers(str(durable), "s"))["__0_0.distcp"] == 3 << 20


def test_a_cancelled_copy_never_commits(tmp_path):
    memory, durable = tmp_path / "mem", tmp_path / "tmp-step"
    durable.mkdir()
    put(memory, 4, 0, "s", {"f": b"1"})
    copy = mt.DurableCopy(
        str(durable),
        "s",
        4,
        folders=mt.held(str(memory), 4, "s"),
        threads=1,
        needed={"g": 1},
        commit=lambda: 1,
    )
    copy.cancel()
    with pytest.raises(mt.CopyCancelled):
        copy.result(timeout=30)
