"""GPU only: memory-tier files read straight into device targets through the reader threads' small pinned buffers
(shard_direct.py), with host targets in the same load (what --cpu-offload holds), and pieces much smaller than the
tensors so that both buffers of a thread take turns many times. DCP's load without a process group; real files."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ftjob_trainer import shard_direct
from ftjob_trainer.contract import TIER_MEMORY
from ftjob_trainer.shard_io import TieredReader
from torch.distributed.checkpoint import FileSystemWriter

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def state() -> dict:
    g = torch.Generator().manual_seed(5)
    big = {
        f"w{i}": torch.randn(1000 + i, 257, generator=g) for i in range(4)
    }  # ~1 MB each, 64 KB pieces below
    return big | {"b": torch.randn(33, generator=g).to(torch.bfloat16), "scalar": torch.tensor(1.5)}


@pytest.mark.parametrize("staging", [64 << 10, shard_direct.STAGING_BYTES])
def test_device_and_host_targets_load_the_saved_bytes(tmp_path, monkeypatch, staging):
    monkeypatch.setattr(shard_direct, "STAGING_BYTES", staging)
    path = tmp_path / "memory"
    dcp.save(state(), storage_writer=FileSystemWriter(str(path), thread_count=2), no_dist=True)
    shards = {n: str(path) for n in os.listdir(path) if n.endswith(".distcp")}
    # every other tensor stays in host memory, as an offloaded parameter would
    out = {
        k: torch.zeros_like(v, device="cuda" if i % 2 == 0 else "cpu")
        for i, (k, v) in enumerate(state().items())
    }
    out["w0"].fill_(
        7.0
    )  # written on the current stream before the load: the reader's stream must wait for it
    reader = TieredReader(str(path), threads=2, memory_files=shards)
    dcp.load(out, storage_reader=reader, no_dist=True)
    torch.cuda.synchronize()
    for k, v in state().items():
        assert torch.equal(out[k].cpu(), v), k
    assert reader.stats.files == {TIER_MEMORY: len(shards)}
    assert reader.stats.direct_bytes == sum(v.numel() * v.element_size() for v in state().values())
