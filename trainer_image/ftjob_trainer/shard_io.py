"""DCP storage for the tiers: a writer that records the files it wrote, and a StorageReader that reads several shard
files at once, each from the fastest tier that has it.

RecordingWriter is DCP's FileSystemWriter that also keeps {file name: bytes} of what this rank wrote: the list a
rank's memory folder and durable markers name (memory_tier.py), without guessing DCP's file names.

DCP's FileSystemReader reads the files a rank needs one after another in the calling thread: 0.72 GB/s for 11.4 GB
on the H200 machine, where the disk and /dev/shm serve several streams far faster. TieredReader keeps DCP's own
per-file decoding (it calls FileSystemReader.read_data on one file's items at a time) and only decides where each
file comes from and runs the files on a thread pool:
- a file this pod holds in its node-local memory tier (memory_files: name -> folder) is read from there;
- every other file from the durable checkpoint folder (`path`), when it is known complete there (durable_sizes:
  name -> bytes written, from the per-rank durable markers of a checkpoint whose durable copy is still running;
  None for a committed folder, where every file is complete).
A file a rank needs that neither tier can serve raises ShardsUnavailable while DCP plans the load, before any tensor
is touched; DCP hands the failure to every rank, so all of them reject the checkpoint together.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.futures import Future

from ftjob_trainer.contract import TIER_DURABLE, TIER_MEMORY, TIER_MIXED


class RecordingWriter(FileSystemWriter):
    def __init__(self, path: str, **kwargs):
        super().__init__(path, **kwargs)
        self.files: dict[
            str, int
        ] = {}  # what write_data wrote: name -> bytes (the .metadata is not among them)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        fut = super().write_data(plan, planner)
        fut.wait()  # FileSystemWriter writes before it returns; wait() raises its failure here
        for result in fut.value():
            info = result.storage_data
            self.files[info.relative_path] = max(
                self.files.get(info.relative_path, 0), info.offset + info.length
            )
        return fut


class ShardsUnavailable(RuntimeError):
    """A file this rank needs is in neither tier (another pod's memory, a durable copy not finished, truncated)."""


@dataclass
class ReadStats:
    """What one load read, per tier: files, bytes; and the wall time of the reads with how many threads."""

    threads: int = 0
    files: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def tier(self) -> str:
        """memory, durable, or mixed (some files from each)."""
        used = [t for t, n in self.files.items() if n]
        return used[0] if len(used) == 1 else (TIER_MIXED if used else TIER_DURABLE)

    def add(self, other: ReadStats) -> None:
        for t, n in other.files.items():
            self.files[t] = self.files.get(t, 0) + n
        for t, n in other.bytes.items():
            self.bytes[t] = self.bytes.get(t, 0) + n
        self.seconds = max(self.seconds, other.seconds)
        self.threads = max(self.threads, other.threads)


def resolve(
    name: str,
    need: int,
    durable_dir: str,
    memory_files: Mapping[str, str],
    durable_sizes: Mapping[str, int] | None,
) -> tuple[str, str] | None:
    """(tier, folder) that serves `need` bytes of file `name`, memory first; None when neither tier can."""
    folder = memory_files.get(name)
    if folder is not None and _size(os.path.join(folder, name)) >= need:
        return TIER_MEMORY, folder
    if durable_sizes is None or durable_sizes.get(name, -1) >= need:
        if _size(os.path.join(durable_dir, name)) >= need:
            return TIER_DURABLE, durable_dir
    return None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


class TieredReader(FileSystemReader):
    def __init__(
        self,
        path: str,
        *,
        threads: int = 8,
        memory_files: Mapping[str, str] | None = None,
        durable_sizes: Mapping[str, int] | None = None,
    ):
        super().__init__(path)
        self.durable_dir = str(path)
        self.threads = max(1, threads)
        self.memory_files = dict(memory_files or {})
        self.durable_sizes = None if durable_sizes is None else dict(durable_sizes)
        self.sources: dict[str, tuple[str, str]] = {}  # file name -> (tier, folder), set while planning
        self.stats = ReadStats()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        need: dict[str, int] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
        missing = []
        self.sources = {}
        for name, n in sorted(need.items()):
            source = resolve(name, n, self.durable_dir, self.memory_files, self.durable_sizes)
            if source is None:
                missing.append(name)
            else:
                self.sources[name] = source
        if missing:
            raise ShardsUnavailable(
                f"{len(missing)} shard file(s) this rank needs are neither in this pod's memory tier nor complete "
                f"in {self.durable_dir}: {missing[:4]}"
            )
        return super().prepare_local_plan(plan)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        sizes = {
            name: sum(self.storage_data[i.storage_index].length for i in items)
            for name, items in per_file.items()
        }
        stats = ReadStats(threads=min(self.threads, max(1, len(per_file))))
        for name, n in sizes.items():
            tier = self.sources.get(name, (TIER_DURABLE, self.durable_dir))[0]
            stats.files[tier] = stats.files.get(tier, 0) + 1
            stats.bytes[tier] = stats.bytes.get(tier, 0) + n

        def read_one(name: str) -> None:
            _, folder = self.sources.get(name, (TIER_DURABLE, self.durable_dir))
            view = copy.copy(self)  # DCP's own decoding, rooted at the file's folder
            view.path = view.fs.init_path(folder)
            FileSystemReader.read_data(view, LoadPlan(per_file[name]), planner).wait()

        started = time.monotonic()
        order = sorted(per_file, key=lambda n: -sizes[n])  # biggest first: the pool ends evenly
        if stats.threads == 1:
            for name in order:
                read_one(name)
        else:
            with ThreadPoolExecutor(stats.threads, thread_name_prefix="ftjob-ckpt-read") as pool:
                for f in [pool.submit(read_one, name) for name in order]:
                    f.result()  # the first failure propagates; DCP reports it on every rank
        stats.seconds = time.monotonic() - started
        self.stats.add(stats)
        fut: Future = Future()
        fut.set_result(None)
        return fut
