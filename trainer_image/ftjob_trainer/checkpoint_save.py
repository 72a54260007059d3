"""One save's files: where this rank writes them (its pod's memory folder, or the durable .tmp-step-N/), the markers
that say where they ended up, rank 0's record of the save (the commit, or the memory commit) with its event, and
their removal when the save failed. Below checkpoint.py, which decides when to save and keeps what was saved.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import time
from typing import Any

import torch
import torch.distributed as dist

from ftjob_trainer import contract, events, memory_tier
from ftjob_trainer.checkpoint_layout import FORMAT, fsync_file, rng_file, write_meta
from ftjob_trainer.checkpoint_store import torch_bytes
from ftjob_trainer.contract import now_rfc3339
from ftjob_trainer.shard_io import RecordingWriter, enospc_in

log = logging.getLogger(
    "ftjob_trainer.checkpoint"
)  # the checkpointer's name: the one people grep the log for


def agree_save(pg: Any, rank: int, direct: bool, refused: bool = False) -> tuple[str, bool, bool]:
    """Collective: rank 0's id of this save (it ties memory copies to it), whether every rank writes straight
    to the durable folder, and whether rank 0's fence refused the save (fence.py: nothing is written then)."""
    mine = torch.tensor(
        [1 if direct else 0, random.getrandbits(62) if rank == 0 else 0, 1 if refused else 0],
        dtype=torch.int64,
    )
    parts = [mine]
    if pg is not None:
        parts = [torch.zeros_like(mine) for _ in range(dist.get_world_size(pg))]
        dist.all_gather(parts, mine, group=pg)
    return f"{int(parts[0][1]):016x}", all(int(p[0]) for p in parts), any(int(p[2]) for p in parts)


def open_files(
    store: Any,
    memory_root: str | None,
    tmp: str,
    step: int,
    rank: int,
    world_size: int,
    *,
    direct: bool,
    write_threads: int,
) -> tuple[str, Any]:
    """This rank's folder for the save (tmp, or a fresh one in its pod's memory tier) with its RNG state written,
    and the DCP writer for it."""
    write_dir = tmp
    if not direct:
        write_dir = memory_tier.rank_dir(memory_root, step, rank)
        shutil.rmtree(write_dir, ignore_errors=True)
        os.makedirs(write_dir)
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    if direct:
        store.write_bytes(rng_file(write_dir, rank), torch_bytes(rng))
    else:  # memory needs no fsync
        torch.save(rng, rng_file(write_dir, rank))
    # Several writer threads, each with its own file: one stream (DCP's default) left the disk half idle and
    # serialized the device-to-host copies with the writes (bench: 26 s for 11.4 GB on a 1.55 GB/s disk).
    # Memory needs no fsync: it is not durable anyway, and the durable copy fsyncs.
    writer = (
        RecordingWriter(
            write_dir,
            sync_files=direct,
            thread_count=write_threads,
            # values every rank may need go to the durable folder at once (another pod cannot read this memory)
            side_dir=None if direct or world_size == 1 else tmp,
        )
        if store.tiered
        else store.writer(tmp, write_threads)
    )
    return write_dir, writer


def save_meta(
    meta: dict, step: int, world_size: int, save_id: str, kind: str, request_id: int | None
) -> dict:
    """The save's ftjob.json: the loop's metadata plus what identifies the save."""
    return dict(
        meta,
        format=FORMAT,
        step=step,
        world_size=world_size,
        save_id=save_id,
        kind=kind,
        request_id=request_id,
    )


@dataclasses.dataclass
class InFlight:
    step: int
    tmp: str  # the durable folder of this save
    write_dir: str  # where this rank's files went: tmp, or its memory folder
    direct: bool  # this rank wrote straight to the durable folder
    all_direct: bool  # every rank did: the memory commit is the commit
    save_id: str
    writer: RecordingWriter
    meta: dict
    started: float
    staging: Any  # a Future done when the state is copied to host memory (None: staged synchronously)
    upload: Any  # a Future done when every rank's shards and the .metadata are written
    request_id: int | None
    kind: str
    marks: dict = dataclasses.field(default_factory=dict)  # phase -> seconds since started (see save_phases)

    def wait_written(self) -> None:
        """Until this rank's state is staged and every rank's files are written; raises if any rank failed."""
        if self.staging is not None:
            self.staging.result()
        self.marks["staged"] = time.monotonic() - self.started
        if self.upload is not None:
            self.upload.result()  # raises if any rank failed: nothing gets committed
        self.marks["written"] = time.monotonic() - self.started

    def seal(self, rank: int) -> dict[str, int]:
        """Say where this rank's files are: complete in the durable folder, or in memory (markers). Returns the
        files of its memory folder (empty when every rank wrote straight to the durable folder)."""
        files: dict[str, int] = {}
        if self.all_direct:
            return files
        files = dict(self.writer.files)
        files[os.path.basename(rng_file(self.write_dir, rank))] = os.path.getsize(
            rng_file(self.write_dir, rank)
        )
        durable_files = files if self.direct else self.writer.side_files
        if durable_files:
            marker = os.path.join(self.tmp, memory_tier.durable_marker(rank))
            memory_tier.write_marker(marker, self.save_id, self.step, rank, durable_files, durable=True)
        if not self.direct:
            marker = os.path.join(self.write_dir, memory_tier.FILES_MARKER)
            memory_tier.write_marker(marker, self.save_id, self.step, rank, files, durable=False)
        return files

    def record(self, store: Any, path: str, tier: str, elapsed: float) -> None:
        """Rank 0, once every rank's files are sealed: the commit (every rank wrote durably) or the memory commit
        (ftjob.json in the durable folder), and its event. Only rank 0 can say so (other ranks may be ahead)."""
        if not self.direct:  # DCP wrote the .metadata into rank 0's memory folder: loaders read it here
            shutil.copyfile(os.path.join(self.write_dir, ".metadata"), os.path.join(self.tmp, ".metadata"))
            fsync_file(os.path.join(self.tmp, ".metadata"))
        if self.all_direct:
            store.commit(self.tmp, self.step, dict(self.meta, time=now_rfc3339(), save_seconds=elapsed))
        else:
            write_meta(self.tmp, dict(self.meta, time=now_rfc3339(), memory_seconds=elapsed))
        self.marks["committed"] = time.monotonic() - self.started
        events.emit(
            contract.EVENT_CHECKPOINT_COMMITTED,
            step=self.step,
            path=path,
            bytes=store.nbytes(path) if self.all_direct else None,  # in memory: spread over the pods
            seconds=round(self.marks["committed"], 4),
            kind=self.kind,
            tier=tier,
            request_id=self.request_id,
        )


@dataclasses.dataclass
class Failure:
    """A save that failed on some rank and was not committed; `kept` is the newest durable commit then, which stays
    the one to resume from (the operator's CheckpointFailing condition holds until a newer one commits)."""

    step: int
    kind: str
    message: str
    kept: str | None
    time: str = dataclasses.field(default_factory=now_rfc3339)


class SaveFailed(Exception):
    """A stop or final save could not be written (a full disk, say): the process exits with an error that says so.
    A periodic or requested save that fails is dropped instead, and training goes on (see Checkpointer.save)."""


def _by_rank(error: BaseException) -> list[tuple[int | None, BaseException]]:
    """DCP's CheckpointException (a BaseException) holds each failing rank's exception; its str() is every rank's
    traceback."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        return [(r, exc) for r, (exc, _) in sorted(failures.items())]
    return [(None, error)]


def describe(error: BaseException | str) -> str:
    """The error in one line, with each failing rank's exception."""
    if not isinstance(error, BaseException):
        return str(error)
    return "; ".join(
        f"{'' if r is None else f'rank {r}: '}{type(exc).__name__}: {exc}" for r, exc in _by_rank(error)
    )


def report_failure(
    step: int, kind: str, error: BaseException | str, kept: str | None, medium: str | None, if_full: str
) -> Failure:
    """A save that failed on some rank: not committed; `kept` is the last committed one, which stays. `if_full`
    says what to do when the medium was full: an ENOSPC in some rank's error (RecordingWriter says it for DCP's
    writes; a local error may hold it as its context), or, for an error without it, the medium left with under
    1 MiB, its failed files still on it."""
    what = describe(error)
    if (
        isinstance(error, BaseException) and any(enospc_in(exc) is not None for _, exc in _by_rank(error))
    ) or _nearly_full(medium):
        what += f" (full: {if_full})"
    log.error(
        "checkpoint of step %d failed (%s); not committed, the last committed one stays %s", step, what, kept
    )
    events.emit(
        contract.EVENT_CHECKPOINT_SKIPPED, step=step, kind=kind, reason="failed", error=what, kept=kept
    )
    message = f"checkpoint of step {step} ({kind}) was not saved: {what}; the last committed one stays {kept}"
    return Failure(step, kind, message, kept)


def _nearly_full(path: str | None) -> bool:
    try:
        return path is not None and shutil.disk_usage(path).free < 1 << 20
    except OSError:  # gone, or an object store's URL
        return False


def discard(store: Any, rank: int, tmp: str, memory_dir: str | None) -> None:
    """A failed save's folders: this rank's memory folder, and (rank 0) the durable one; the space comes back."""
    if memory_dir:
        shutil.rmtree(memory_dir, ignore_errors=True)
    if rank == 0:
        store.discard(tmp)
