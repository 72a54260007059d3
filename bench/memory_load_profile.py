"""Where a load from the memory tier spends its time (issue 10: >= 8 GB/s from the memory tier).

One process, no process group: the 1b preset's parameters plus two AdamW moments per parameter (the trainer's
state, 11.4 GB) as plain tensors on the device, saved once with DCP into a /dev/shm folder the way the trainer
writes its memory tier (8 writer threads, one file each, no fsync), then loaded back several ways, each timed:

  files          the folder's files read on 8 threads into host buffers touched beforehand (what the medium gives;
                 no decoding, no page faults)
  to_host        DCP's load through TieredReader into host tensors (decoding, no device copy)
  h2d_pageable   those host tensors copied to the device one after another (pageable memory)
  tiered         TieredReader into the device tensors, the files read as durable ones (DCP's decoding): what the
                 trainer does with durable files, and did with memory-tier files before shard_direct.py
  direct         TieredReader with every file named as this pod's memory tier: each tensor's bytes read straight
                 into its target through small pinned buffers (shard_direct.py): what the trainer does with
                 memory-tier files
  tiered_staged  TieredReader with StagedPlanner (below): each tensor lands in pinned memory and is copied to
                 the device asynchronously on its reader thread's own stream

GB/s is the state's bytes over the wall time. Results: DIR/profile.json.

    python bench/memory_load_profile.py --out DIR [--dir /dev/shm/ftjob-profile] [--model 1b] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from ftjob_trainer.models import llama
from ftjob_trainer.shard_io import TieredReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner


def state_on(device: torch.device, model: str) -> dict:
    with torch.device("meta"):
        net = llama.build(model)
    params = {k: torch.empty(p.shape, dtype=p.dtype, device=device) for k, p in net.named_parameters()}
    for t in params.values():
        t.uniform_(-1, 1)
    optim = {f"{k}.{m}": torch.rand_like(t) for k, t in params.items() for m in ("exp_avg", "exp_avg_sq")}
    return {"model": params, "optim": optim}


def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for part in state.values() for t in part.values())


def empty_like(state: dict, device: torch.device) -> dict:
    return {k: {n: torch.empty_like(t, device=device) for n, t in part.items()} for k, part in state.items()}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    started = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - started


class StagedPlanner(DefaultLoadPlanner):
    """DCP's load planner with each device tensor decoded into pinned host memory first, then copied to the device
    asynchronously on the reading thread's own stream, so the copies of several threads (and the next tensor's
    decoding) overlap; DCP's own copy_ from pageable memory is synchronous, on the default stream. Not in the
    trainer: a first load in a process is no faster (bench/RESULTS.md). The caller synchronizes the device."""

    def __init__(self):
        super().__init__()
        self.local = threading.local()  # .stream: the reading thread's
        # id(read item) -> (device tensor, its pinned staging); DCP hands commit_tensor a detached alias instead
        self.targets: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def resolve_tensor(self, read_item):
        target = super().resolve_tensor(read_item)
        if target.device.type != "cuda":
            return target
        staging = torch.empty(target.shape, dtype=target.dtype, pin_memory=True)
        self.targets[id(read_item)] = (target, staging)
        return staging

    def commit_tensor(self, read_item, tensor: torch.Tensor) -> None:
        staged = self.targets.pop(id(read_item), None)
        if staged is not None:
            target, staging = staged
            if getattr(self.local, "stream", None) is None:
                self.local.stream = torch.cuda.Stream()
            # the pinned block is not reused before the copy ends: the host allocator records the copy's event
            with torch.cuda.stream(self.local.stream):
                target.detach().copy_(staging, non_blocking=True)
            tensor = target
        super().commit_tensor(read_item, tensor)


def file_reader(folder: Path, threads: int):
    """A function that reads the folder's files on `threads` threads into buffers allocated (and touched) once
    here: what the medium gives, without the page faults of fresh memory."""
    files = [p for p in folder.iterdir() if p.suffix == ".distcp"]
    buffers = {p: bytearray(p.stat().st_size) for p in files}  # zero-filled: every page already touched

    def read(path: Path) -> None:
        with open(path, "rb", buffering=0) as f:
            f.readinto(buffers[path])

    def read_all() -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, files))

    return read_all


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dir", type=Path, default=Path("/dev/shm/ftjob-profile"))
    p.add_argument("--model", default="1b", choices=sorted(llama.PRESETS))
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2, help="runs of each way (the best is reported too)")
    a = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    a.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    state = state_on(device, a.model)
    size = nbytes(state)
    save_s = timed(
        lambda: dcp.save(
            state, storage_writer=dcp.FileSystemWriter(str(a.dir), sync_files=False, thread_count=a.threads)
        )
    )
    host = empty_like(state, torch.device("cpu"))
    target = empty_like(state, device)

    shards = {p.name: str(a.dir) for p in a.dir.iterdir() if p.suffix == ".distcp"}

    def load(into: dict, planner: DefaultLoadPlanner | None = None, memory: bool = False) -> None:
        reader = TieredReader(str(a.dir), threads=a.threads, memory_files=shards if memory else None)
        dcp.load(into, storage_reader=reader, planner=planner, no_dist=True)
        loads.append(reader.stats)

    loads: list = []  # each load's ReadStats

    ways = {
        "files": file_reader(a.dir, a.threads),
        "to_host": lambda: load(host),
        "h2d_pageable": lambda: [target[k][n].copy_(t) for k, part in host.items() for n, t in part.items()],
        "tiered": lambda: load(target),
        "tiered_staged": lambda: load(target, StagedPlanner()),
        "direct": lambda: load(target, memory=True),
    }
    runs: dict[str, list[float]] = {}
    direct_bytes, direct_phases = 0, {}
    for name, fn in ways.items():
        if device.type == "cpu" and name in ("h2d_pageable", "tiered_staged"):
            continue
        runs[name] = []
        for _ in range(a.repeat):
            # untimed: `equal` below then checks what the last way (direct) loaded
            for part in target.values():
                for t in part.values():
                    t.zero_()
            runs[name].append(round(timed(fn), 4))
        if name == "direct":
            direct_bytes = loads[-1].direct_bytes
            direct_phases = {k: round(v, 3) for k, v in loads[-1].direct_seconds.items()}
    equal = all(torch.equal(target[k][n], t) for k, part in state.items() for n, t in part.items())
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        # torch's CPU allocator asks for transparent huge pages for big blocks when this is 1 (fewer page faults)
        "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "model": a.model,
        "threads": a.threads,
        "state_bytes": size,
        "files": len([p for p in a.dir.iterdir() if p.suffix == ".distcp"]),
        "save_s": round(save_s, 3),
        "seconds": runs,
        "best_gbps": {k: round(size / min(v) / 1e9, 3) for k, v in runs.items()},
        "loaded_equal": equal,
        "direct_bytes": direct_bytes,  # of the direct way: what was read straight into the targets
        "direct_thread_seconds": direct_phases,  # its last load: per phase, summed over the reader threads
    }
    (a.out / "profile.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    shutil.rmtree(a.dir, ignore_errors=True)
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
