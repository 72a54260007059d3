"""shard_direct: a shard file (either tier) is read straight into the load's targets. Tensors that can be copied byte for byte
(whole tensors and runs of whole rows) are read with pread into their targets; everything else (plain values, a
dtype change, a strided target, a column slice) goes through DCP's decoding, and every way ends with the saved
values. Real DCP files, DCP's own planner; on CPU (the pinned-buffer path to the device is in the GPU tests)."""

from __future__ import annotations

import io
import os
import sys
import zipfile

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ftjob_trainer import shard_direct
from ftjob_trainer.contract import TIER_DURABLE, TIER_MEMORY
from ftjob_trainer.shard_io import TieredReader
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem


def state() -> dict:
    g = torch.Generator().manual_seed(3)
    tensors = {f"t{i}": torch.randn(64 + i, 8, generator=g) for i in range(6)}
    return tensors | {
        "half": torch.randn(32, 4, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "step": 9,
    }


def tensor_bytes(s: dict) -> int:
    return sum(t.numel() * t.element_size() for t in s.values() if isinstance(t, torch.Tensor))


@pytest.fixture
def saved(tmp_path, world_of_one):
    path = tmp_path / "memory"
    dcp.save(state(), storage_writer=FileSystemWriter(str(path), thread_count=3))
    shards = sorted(n for n in os.listdir(path) if n.endswith(".distcp"))
    return path, shards


def load(path, shards, into: dict, memory: bool = True) -> TieredReader:
    memory_files = {n: str(path) for n in shards} if memory else {}
    reader = TieredReader(str(path), threads=2, memory_files=memory_files)
    dcp.load(into, storage_reader=reader)
    return reader


def zeros() -> dict:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state().items()}


def test_whole_tensors_come_from_the_mapping_and_plain_values_from_dcp(saved):
    path, shards = saved
    out = zeros()
    reader = load(path, shards, out)
    expected = state()
    assert all(torch.equal(out[k], v) for k, v in expected.items() if isinstance(v, torch.Tensor))
    assert out["step"] == 9  # a plain value: DCP's own decoding
    assert reader.stats.files == {TIER_MEMORY: len(shards)}
    assert reader.stats.direct_bytes == tensor_bytes(expected)


def test_durable_files_are_read_directly_too(saved):
    """The launcher reads a durable checkpoint ahead into the page cache: decoding it would halve the load's rate."""
    path, shards = saved
    out = zeros()
    reader = load(path, shards, out, memory=False)
    expected = state()
    assert all(torch.equal(out[k], v) for k, v in expected.items() if isinstance(v, torch.Tensor))
    assert reader.stats.files == {TIER_DURABLE: len(shards)}
    assert reader.stats.direct_bytes == tensor_bytes(expected)


def _with_byte_order(record: bytes, order: str | None) -> bytes:
    """The torch.save record `record` (a zip) rewritten with its byteorder entry saying `order` (None: no entry)."""
    src = zipfile.ZipFile(io.BytesIO(record))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            if not info.filename.endswith("/byteorder"):
                dst.writestr(info, src.read(info))
            elif order is not None:
                dst.writestr(info, order.encode())
    return out.getvalue()


def _says_native(tmp_path, record: bytes) -> bool:
    (tmp_path / "record").write_bytes(record)
    fd = os.open(tmp_path / "record", os.O_RDONLY)
    try:
        return shard_direct._native_byte_order(fd, 0, len(record))
    finally:
        os.close(fd)


def test_a_file_in_another_byte_order_is_left_to_dcp(saved, tmp_path, monkeypatch):
    """A shard file may come from another machine: its records' byteorder entry must be this machine's for a byte
    copy; one that says another order, or none, takes DCP's decoding (torch.load swaps what it must)."""
    path, shards = saved
    fs = FileSystemReader(str(path))
    first = min(
        (i for i in fs.read_metadata().storage_data.values() if i.relative_path == shards[0]),
        key=lambda i: i.offset,
    )
    record = (path / shards[0]).read_bytes()[first.offset : first.offset + first.length]
    assert _says_native(tmp_path, record)  # torch.save's own record, written here
    other = "big" if sys.byteorder == "little" else "little"
    assert not _says_native(tmp_path, _with_byte_order(record, other))
    assert not _says_native(tmp_path, _with_byte_order(record, None))
    # the whole file then goes through DCP's decoding, to the same values
    monkeypatch.setattr(shard_direct, "_native_byte_order", lambda fd, offset, length: False)
    out = zeros()
    reader = load(path, shards, out, memory=False)
    assert all(torch.equal(out[k], v) for k, v in state().items() if isinstance(v, torch.Tensor))
    assert reader.stats.direct_bytes == 0


def test_a_dtype_change_or_a_strided_target_is_decoded_by_dcp(saved):
    path, shards = saved
    expected = state()
    out = zeros()
    out["t0"] = torch.zeros(64, 8, dtype=torch.float64)  # DCP converts; a byte copy could not
    strided = torch.zeros(8, 65).t()  # the right size, not contiguous
    out["t1"] = strided
    reader = load(path, shards, out)
    assert torch.equal(out["t0"], expected["t0"].double())
    assert torch.equal(strided, expected["t1"]) and not strided.is_contiguous()
    skipped = expected["t0"].numel() * 4 + expected["t1"].numel() * 4
    assert reader.stats.direct_bytes == tensor_bytes(expected) - skipped


def read_slice(
    path, name: str, offsets: list[int], lengths: list[int]
) -> tuple[torch.Tensor, shard_direct.DirectRead]:
    """What a resharded load asks of one file: a slice of a saved tensor, through DCP's planner."""
    fs = FileSystemReader(str(path))
    metadata = fs.read_metadata()
    fs.set_up_storage_reader(metadata, True)
    target = {name: torch.zeros(lengths)}
    planner = DefaultLoadPlanner()
    planner.set_up_planner(target, metadata, True)
    item = ReadItem(
        type=LoadItemType.TENSOR,
        dest_index=MetadataIndex(name, [0, 0]),
        dest_offsets=torch.Size([0, 0]),
        storage_index=MetadataIndex(name, [0, 0]),
        storage_offsets=torch.Size(offsets),
        lengths=torch.Size(lengths),
    )
    file = fs.storage_data[item.storage_index].relative_path

    def decode(items):
        fs.read_data(LoadPlan(items), planner).wait()

    done = shard_direct.read_file(str(path / file), [item], fs.storage_data, planner, decode)
    return target[name], done


def test_a_run_of_whole_rows_is_read_directly_and_a_column_slice_decoded(saved):
    path, _ = saved
    full = state()["t2"]
    rows, done = read_slice(path, "t2", [10, 0], [5, 8])
    assert torch.equal(rows, full[10:15]) and done.direct_bytes == 5 * 8 * 4 and done.fallback_items == 0
    cols, done = read_slice(path, "t2", [0, 2], [66, 3])
    assert torch.equal(cols, full[:, 2:5]) and done.direct_bytes == 0 and done.fallback_items == 1


def test_a_damaged_record_header_fails_the_read(saved):
    path, shards = saved
    for name in shards:
        data = bytearray((path / name).read_bytes())
        data[:64] = b"\0" * 64  # the first record's zip header
        (path / name).write_bytes(bytes(data))
    out = zeros()
    with pytest.raises(CheckpointException):  # DCP's wrapper of a rank's read error (a BaseException)
        load(path, shards, out)
