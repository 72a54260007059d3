"""TieredReader: DCP loads through a thread pool, each file from this pod's memory tier when it holds it, else from
the durable folder when complete there; a file neither tier serves fails the load while planning, before any
tensor changes. World of one, gloo, real DCP files."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ftjob_trainer.contract import TIER_DURABLE, TIER_MEMORY
from ftjob_trainer.shard_io import RecordingWriter, ShardsUnavailable, TieredReader
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.randn(64 + i, 8, generator=g) for i in range(12)} | {"step": seed}


def zeros() -> dict:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state(0).items()}


@pytest.fixture
def saved(tmp_path, world_of_one):
    path = tmp_path / "durable"
    dcp.save(state(7), storage_writer=FileSystemWriter(str(path), thread_count=4))
    shards = sorted(n for n in os.listdir(path) if n.endswith(".distcp"))
    assert len(shards) == 4
    return path, shards


def equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def test_durable_only_with_threads(saved):
    path, shards = saved
    out, reader = zeros(), TieredReader(str(path), threads=3)
    dcp.load(out, storage_reader=reader)
    assert equal(out, state(7))
    assert reader.stats.files == {TIER_DURABLE: 4} and reader.stats.threads == 3
    assert reader.stats.tier() == TIER_DURABLE and reader.stats.total_bytes > 12 * 64 * 8 * 4


def test_memory_files_win_and_are_counted(saved, tmp_path):
    path, shards = saved
    memory = tmp_path / "memory"
    memory.mkdir()
    for name in shards[:2]:
        shutil.copy(path / name, memory / name)
        (path / name).write_bytes(
            b"\0" * (path / name).stat().st_size
        )  # durable copy unusable: memory must serve
    out, reader = zeros(), TieredReader(str(path), memory_files={n: str(memory) for n in shards[:2]})
    dcp.load(out, storage_reader=reader)
    assert equal(out, state(7))
    assert reader.stats.files == {TIER_MEMORY: 2, TIER_DURABLE: 2} and reader.stats.tier() == "mixed"


def test_truncated_memory_file_falls_back_to_the_durable_one(saved, tmp_path):
    path, shards = saved
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / shards[0]).write_bytes(b"short")
    out, reader = zeros(), TieredReader(str(path), memory_files={shards[0]: str(memory)})
    dcp.load(out, storage_reader=reader)
    assert equal(out, state(7)) and reader.stats.files == {TIER_DURABLE: 4}


def test_a_file_in_neither_tier_fails_before_any_tensor_changes(saved):
    path, shards = saved
    out = zeros()
    # a durable copy still running: only the files a durable marker lists are complete
    reader = TieredReader(str(path), durable_sizes={n: os.path.getsize(path / n) for n in shards[1:]})
    with pytest.raises(CheckpointException) as e:  # a BaseException: `except Exception` does not catch it
        dcp.load(out, storage_reader=reader)
    assert ShardsUnavailable.__name__ in str(e.value)  # DCP wraps it in a CheckpointException on every rank
    assert equal(out, zeros())


def test_the_writer_records_every_file_it_wrote(tmp_path, world_of_one):
    writer = RecordingWriter(str(tmp_path), thread_count=3)
    dcp.save(state(1), storage_writer=writer)
    on_disk = {n: os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path) if n != ".metadata"}
    assert writer.files == on_disk and len(on_disk) == 3


def test_small_whole_values_go_to_the_side_folder_and_load_from_there(tmp_path, world_of_one):
    memory, durable = tmp_path / "memory", tmp_path / "durable"
    big = {"big": torch.randn(600, 600)}  # 1.4 MB: over SIDE_MAX_BYTES, stays with the shards
    writer = RecordingWriter(str(memory), thread_count=2, side_dir=str(durable))
    durable.mkdir()
    dcp.save(state(3) | big, storage_writer=writer)
    assert writer.side_files and all(n.startswith("__0_replicated_") for n in writer.side_files)
    assert set(writer.side_files) == {n for n in os.listdir(durable)}
    assert writer.files and not set(writer.files) & set(writer.side_files)
    shutil.copy(memory / ".metadata", durable / ".metadata")  # rank 0 does this at the memory commit
    out = zeros() | {"big": torch.zeros(600, 600)}
    reader = TieredReader(str(durable), memory_files={n: str(memory) for n in writer.files})
    dcp.load(out, storage_reader=reader)
    assert equal(out, state(3) | big)
    assert set(reader.stats.files) == {TIER_MEMORY, TIER_DURABLE}
