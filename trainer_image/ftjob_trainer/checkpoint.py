"""Sharded, atomically committed DCP checkpoints across ranks, in two tiers, and the events of saves.

A save writes each rank's files into its pod's memory tier (--memory-checkpoint-dir) when there is one, or straight
into the durable folder (.tmp-step-N/ under --checkpoint-dir) when there is none or when this rank's files must be
durable before save() returns: a preempted pod's stop save (its memory goes with the node) and the final save.
Once every rank's files are written, rank 0 writes ftjob.json into .tmp-step-N/: the memory commit (resumable by a
world that can read every file it needs). Memory folders are then copied to the durable folder in the background
(memory_tier.DurableCopy) and rank 0 renames the folder once every rank's files are durable: the commit. A save
whose files all went straight to the durable folder commits at once. poll() hands the loop each commit, memory
first, then durable: only durable ones may be reported as the job's lastCheckpoint. Loading is checkpoint_load.py;
the on-disk layout, commit and retention checkpoint_layout.py; async staging checkpoint_staging.py.
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
import torch.distributed.checkpoint as dcp

from ftjob_trainer import contract, events, memory_tier
from ftjob_trainer.checkpoint_copy import Commit, DurableCopies
from ftjob_trainer.checkpoint_layout import (
    FORMAT,
    Retention,
    committed_name,
    fsync_file,
    rng_file,
    write_meta,
)
from ftjob_trainer.checkpoint_load import Loaded, Loader, NothingLoadable  # noqa: F401 - re-exported
from ftjob_trainer.checkpoint_staging import STAGED_ASYNC, non_data_values, state_nbytes
from ftjob_trainer.checkpoint_state import (  # noqa: F401 - the guard, re-exported (the seed's tests import it here)
    needs_manual_param_reload,
    params_on_device,
    state_of,
)
from ftjob_trainer.checkpoint_store import open_store, torch_bytes
from ftjob_trainer.contract import (
    KIND_FINAL,
    KIND_PERIODIC,
    KIND_STOP,
    TIER_DURABLE,
    TIER_MEMORY,
    now_rfc3339,
)
from ftjob_trainer.shard_io import RecordingWriter

if STAGED_ASYNC:
    from ftjob_trainer.checkpoint_staging import new_stager

log = logging.getLogger(__name__)


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


class Checkpointer:
    def __init__(
        self,
        root: str | None,
        keep_last: int,
        engine: Any,
        rank: int,
        world_size: int,
        *,
        write_threads: int = 8,
        read_threads: int = 8,
        memory_root: str | None = None,
        local_rank: int = 0,
        local_world_size: int = 1,
    ):
        self.root, self.keep_last, self.engine = root, keep_last, engine
        self.write_threads, self.read_threads = write_threads, read_threads
        self.rank, self.world_size = rank, world_size
        self.memory_root = memory_root if root else None
        self.local_rank, self.local_world_size = local_rank, max(1, local_world_size)
        self.inflight: InFlight | None = None
        self.last_committed: tuple[int, str] | None = None  # newest durable commit: the one to report
        self.last_saved: tuple[int, str] | None = None  # newest save whose files are all written (any tier)
        self.save_seconds: float | None = None  # measured: last save from start to its durable commit
        self.save_phases: dict = {}
        self.store = open_store(root) if root else None  # a folder, or an object store URL (no memory tier)
        self.retention = Retention(self.store, keep_last) if root else None
        self.copies = DurableCopies(root, rank, self.retention, write_threads) if root else None
        self.state_bytes = 0
        self.stager = None
        self._commits: list[Commit] = []
        # DCP's collectives run on their own gloo group: an async save's background thread must not share a
        # communicator with the training loop's collectives.
        self.pg = dist.new_group(backend="gloo") if dist.is_initialized() else None
        if root:
            if rank == 0:
                self.store.start()
            self._barrier()
            done = self.store.list_committed()
            self.last_committed = done[0] if done else None
            self.loader = Loader(
                self.store,
                self.memory_root,
                engine,
                self.pg,
                rank,
                read_threads=read_threads,
                write_threads=write_threads,
                retention=self.retention,
                local_rank=local_rank,
                local_world_size=self.local_world_size,
            )

    def use_engine(self, engine: Any) -> None:
        """The engine rebuilt (initialised) after a load found nothing this world can read."""
        self.engine = engine
        if self.root:
            self.loader.engine = engine

    def _barrier(self) -> None:
        if self.pg is not None:
            dist.barrier(group=self.pg)

    def _state(self) -> dict:
        return state_of(self.engine)

    def _get_stager(self):
        if self.stager is None:
            self.stager = (
                new_stager()
            )  # its pinned buffers: allocated by the first save, reused by later ones
        return self.stager

    def warm_up(self):
        """Allocate the pinned staging buffers now, in the stager's thread, so that neither the first periodic save
        (a 6.5 s stall on the H200 machine for 11.4 GB) nor a first preemption save pays for them. Returns the
        staging Future (None when there is nothing to warm). The copy it makes is thrown away: it only sizes the
        buffers, so it may overlap training steps. Skipped when params are offloaded by hand (their storage changes
        at every move, so no buffer could be reused)."""
        if not (STAGED_ASYNC and self.root and torch.cuda.is_available()):
            return None
        if needs_manual_param_reload(self.engine) or self.stager is not None:
            return None  # by-hand offload, or the buffers already exist
        return self._get_stager().stage(self._state())

    def close(self, wait_for_retention: bool = False) -> None:
        """Drain an in-flight save (its files must not be half-written), stop a durable copy (a restarted worker
        finishes it) and release the staging buffers; at the end of a finished run also wait for retention's
        deletions (a stopped run leaves them to the next start: its grace period is short)."""
        try:
            self.drain()
        finally:
            self._settle_copy(supersede=True)  # a restarted worker finishes it
            if self.stager is not None:
                self.stager.close()
                self.stager = None
            if wait_for_retention:
                self.wait_for_retention()

    # --- save ------------------------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        meta: dict,
        *,
        asynchronous: bool = False,
        request_id: int | None = None,
        kind: str = KIND_PERIODIC,
        durable_now: bool = False,
    ) -> str | None:
        """Collective. Sync: returns the folder of the save's commit (durable, or memory: see Commit). Async:
        returns None; poll()/drain() finish it. durable_now: this rank's files go straight to the durable folder."""
        assert self.root, "save() needs a checkpoint directory"
        events.emit(
            contract.EVENT_CHECKPOINT_SAVE_STARTED,
            step=step,
            kind=kind,
            asynchronous=asynchronous,
            waits_for=self.inflight.step if self.inflight else None,  # an async save to finish first
        )
        if self.inflight and self.inflight.step == step and not asynchronous:
            self.drain()  # an async save of this very step is in flight: finishing it is enough
            self._barrier()
        if self.last_saved and self.last_saved[0] == step:  # this exact state is saved already
            if kind == KIND_FINAL:  # the job ends here: its last save must be committed, not only copied
                self._settle_copy(supersede=False)
            elif durable_now:
                self.wait_own_files_durable()
            return self.last_saved[1]
        self.drain()
        # a newer stop or final save supersedes the durable copy of an older one; any other save waits for it, so
        # the durable tier never falls more than one save behind
        self._settle_copy(supersede=kind in (KIND_STOP, KIND_FINAL))
        started = time.monotonic()
        tmp = self.store.save_path(step)
        if self.rank == 0:
            self.store.prepare(tmp)
        direct = durable_now or not self.memory_root
        save_id, all_direct = self._agree_save(direct)  # also the barrier after rank 0 made the folder
        write_dir = tmp
        if not direct:
            write_dir = memory_tier.rank_dir(self.memory_root, step, self.rank)
            shutil.rmtree(write_dir, ignore_errors=True)
            os.makedirs(write_dir)
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        if direct:
            self.store.write_bytes(rng_file(write_dir, self.rank), torch_bytes(rng))
        else:  # memory needs no fsync
            torch.save(rng, rng_file(write_dir, self.rank))
        meta = dict(
            meta,
            format=FORMAT,
            step=step,
            world_size=self.world_size,
            save_id=save_id,
            kind=kind,
            request_id=request_id,
        )
        # Several writer threads, each with its own file: one stream (DCP's default) left the disk half idle and
        # serialized the device-to-host copies with the writes (bench: 26 s for 11.4 GB on a 1.55 GB/s disk).
        # Memory needs no fsync: it is not durable anyway, and the durable copy fsyncs.
        writer = (
            RecordingWriter(
                write_dir,
                sync_files=direct,
                thread_count=self.write_threads,
                # values every rank may need go to the durable folder at once (another pod cannot read this memory)
                side_dir=None if direct or self.world_size == 1 else tmp,
            )
            if self.store.tiered
            else self.store.writer(tmp, self.write_threads)
        )
        with params_on_device(self.engine):
            state = self._state()
            if not self.state_bytes:  # the first save: check once what the stager will deep-copy
                bad = non_data_values(state)
                if bad:
                    raise TypeError(
                        "the checkpoint state may hold only tensors and plain data (the async stager deep-copies "
                        f"it); move these into the step's metadata or drop them: {bad[:5]}"
                    )
                self.state_bytes = state_nbytes(state)
            if STAGED_ASYNC:
                # Sync saves (the preemption save) take the same path and wait: copying into the pinned buffers the
                # periodic saves already hold beats DCP's pageable per-tensor copies in the writer threads.
                stager = self._get_stager()
                if torch.cuda.is_available():
                    stager.ready = torch.cuda.Event()
                    stager.ready.record()  # after the last kernel that changes the state
                resp = dcp.async_save(
                    state, storage_writer=writer, process_group=self.pg, async_stager=stager
                )
                staging, upload = resp.staging_completion, resp.upload_completion
                staging.add_done_callback(_on_staged(step, kind, started))
                if needs_manual_param_reload(self.engine):
                    staging.result()  # the params move back to the host right after this block
            elif not asynchronous:
                dcp.save(state, storage_writer=writer, process_group=self.pg)
                staging = upload = None
            else:  # older torch: async_save stages synchronously (no pinned reuse), then writes in the background
                upload, staging = dcp.async_save(state, storage_writer=writer, process_group=self.pg), None
                _emit_staged(step, kind, started)
        self.inflight = InFlight(
            step,
            tmp,
            write_dir,
            direct,
            all_direct,
            save_id,
            writer,
            meta,
            started,
            staging,
            upload,
            request_id,
            kind,
        )
        self.inflight.marks["submitted"] = time.monotonic() - started
        if asynchronous:
            return None
        return self._finish(synchronous=True)[1]

    def _agree_save(self, direct: bool) -> tuple[str, bool]:
        """Collective: rank 0's id of this save (it ties memory copies to it), and whether every rank writes
        straight to the durable folder."""
        mine = torch.tensor(
            [1 if direct else 0, random.getrandbits(62) if self.rank == 0 else 0], dtype=torch.int64
        )
        parts = [mine]
        if self.pg is not None:
            parts = [torch.zeros_like(mine) for _ in range(dist.get_world_size(self.pg))]
            dist.all_gather(parts, mine, group=self.pg)
        return f"{int(parts[0][1]):016x}", all(int(p[0]) for p in parts)

    def wait_for_staging(self) -> None:
        """Called right before optimizer.step(): the staged copy must be complete before params change."""
        if self.inflight and self.inflight.staging is not None:
            self.inflight.staging.result()
            self.inflight.staging = None

    def poll(self) -> list[Commit]:
        """Non-blocking: finish an async save whose files are written (its memory commit, or its commit), reap a
        finished durable copy; returns the commits since the last call. A background save that failed (disk or
        /dev/shm full, a lost peer) is logged and dropped: the last save stays the one to resume from."""
        f = self.inflight
        if f is not None and (f.upload is None or f.upload.done()):
            self._finish_or_drop()
        if self.copies is not None and self.copies.done():
            self._settle_copy(supersede=False)
        return self.take_commits()

    def take_commits(self) -> list[Commit]:
        out, self._commits = self._commits, []
        return out

    def pending_seconds(self) -> float:
        """A guess of how long the in-flight save still needs (its measured duration minus its age)."""
        if self.inflight is None:
            return 0.0
        return max(0.0, (self.save_seconds or 0.0) - (time.monotonic() - self.inflight.started))

    def drain(self) -> tuple[int, str, int | None] | None:
        """Wait for an in-flight save's files and finish it (before exit, before the next save): (step, folder of
        its commit, request id), or None (nothing in flight, or it failed)."""
        if self.inflight is None:
            return None
        return self._finish_or_drop()

    def _finish_or_drop(self) -> tuple[int, str, int | None] | None:
        """Finish the in-flight save; if its background write failed (disk full, a lost peer), log it, remove its
        folders and return None: the last save stays the one to resume from, and the caller's next save (the
        preemption save on the stop path) still runs. DCP raises the failure on every rank alike."""
        f = self.inflight
        try:
            return self._finish(synchronous=False)
        except Exception as e:  # noqa: BLE001 - any failure of the background write means: not committed
            log.error(
                "async checkpoint of step %d failed (%s: %s); not committed, the last committed one stays %s",
                f.step,
                type(e).__name__,
                e,
                self.last_committed[1] if self.last_committed else None,
            )
            events.emit(
                contract.EVENT_CHECKPOINT_SKIPPED,
                step=f.step,
                kind=f.kind,
                reason="failed",
                error=f"{type(e).__name__}: {e}",
            )
            if not f.direct:  # a full /dev/shm would fail every save: the durable tier alone from now on
                log.warning(
                    "memory tier %s disabled after the failure: size the pod's /dev/shm", self.memory_root
                )
                self.memory_root = None
                shutil.rmtree(f.write_dir, ignore_errors=True)
            if self.rank == 0:
                self.store.discard(f.tmp)
            return None

    def _finish(self, *, synchronous: bool) -> tuple[int, str, int | None]:
        f = self.inflight
        assert f is not None
        self.inflight = None
        if f.staging is not None:
            f.staging.result()
        f.marks["staged"] = time.monotonic() - f.started
        if f.upload is not None:
            f.upload.result()  # raises if any rank failed: nothing gets committed
        f.marks["written"] = time.monotonic() - f.started
        files: dict[str, int] = {}
        if not f.all_direct:  # say where this rank's files are: complete in the durable folder, or in memory
            files = dict(f.writer.files)
            files[os.path.basename(rng_file(f.write_dir, self.rank))] = os.path.getsize(
                rng_file(f.write_dir, self.rank)
            )
            durable_files = files if f.direct else f.writer.side_files
            if durable_files:
                marker = os.path.join(f.tmp, memory_tier.durable_marker(self.rank))
                memory_tier.write_marker(marker, f.save_id, f.step, self.rank, durable_files, durable=True)
            if not f.direct:
                marker = os.path.join(f.write_dir, memory_tier.FILES_MARKER)
                memory_tier.write_marker(marker, f.save_id, f.step, self.rank, files, durable=False)
        if synchronous:
            self._barrier()  # every rank's files are sealed before rank 0 records the save
        final = os.path.join(self.root, committed_name(f.step))
        path, tier = (final, TIER_DURABLE) if f.all_direct else (f.tmp, TIER_MEMORY)
        elapsed = time.monotonic() - f.started
        if self.rank == 0:
            if not f.direct:  # DCP wrote the .metadata into rank 0's memory folder: loaders read it here
                shutil.copyfile(os.path.join(f.write_dir, ".metadata"), os.path.join(f.tmp, ".metadata"))
                fsync_file(os.path.join(f.tmp, ".metadata"))
            if f.all_direct:
                self.store.commit(f.tmp, f.step, dict(f.meta, time=now_rfc3339(), save_seconds=elapsed))
            else:
                write_meta(f.tmp, dict(f.meta, time=now_rfc3339(), memory_seconds=elapsed))
            f.marks["committed"] = time.monotonic() - f.started
            # rank 0's rename (or ftjob.json) is the commit: only it can say so (other ranks may be ahead of it)
            events.emit(
                contract.EVENT_CHECKPOINT_COMMITTED,
                step=f.step,
                path=path,
                bytes=self.store.nbytes(path) if f.all_direct else None,  # in memory: spread over the pods
                seconds=round(f.marks["committed"], 4),
                kind=f.kind,
                tier=tier,
                request_id=f.request_id,
            )
            if f.all_direct:
                self.retention.apply()
        if synchronous:
            self._barrier()  # nobody reports (or exits on) a save before rank 0 recorded it
        f.marks["done"] = time.monotonic() - f.started
        # For a sync save, where its time went (cumulative seconds): state dict + submit, copy to host memory,
        # files written, commit (rank 0), retention. For an async one, when each wait ended.
        self.save_phases = dict(f.marks)
        self.last_saved = (f.step, path)
        self._commits.append(Commit(f.step, path, tier, f.request_id, f.kind, elapsed))
        if f.all_direct:
            self.save_seconds, self.last_committed = f.marks["done"], (f.step, final)
        elif f.kind != KIND_STOP:  # after a stop save this process exits: the restarted worker copies
            folders = [] if f.direct else [memory_tier.RankFolder(self.rank, f.write_dir, files)]
            self.copies.start(f.step, f.tmp, f.meta, folders, f.started)
        self._prune_memory(keep={f.step})
        log.info("checkpoint step %d saved (%s) at %s in %.2fs", f.step, tier, path, f.marks["done"])
        return f.step, path, f.request_id

    def _settle_copy(self, *, supersede: bool) -> None:
        done = self.copies.settle(supersede=supersede) if self.copies is not None else None
        if done is not None:
            self.last_committed, self.save_seconds = (done.step, done.path), done.seconds
            self._commits.append(done)

    def wait_own_files_durable(self, timeout: float | None = None) -> bool:
        """A preempted rank whose latest save is memory-committed: wait until the files its pod holds are durable."""
        return self.copies is None or self.copies.wait_own_files_durable(timeout)

    def _prune_memory(self, keep: set[int]) -> None:
        if self.local_rank == 0:  # one process per pod tidies the pod's memory folder
            memory_tier.prune(self.memory_root, keep)

    def wait_for_retention(self, timeout: float | None = None) -> None:
        if self.retention is not None:
            self.retention.wait(timeout)

    def estimate_save_seconds(self) -> float | None:
        return self.save_seconds

    # --- load -----------------------------------------------------------------------------------------------
    def load_latest(self) -> Loaded | None:
        """Collective. The newest checkpoint every rank can read (checkpoint_load.py); a memory-committed one gets
        its durable copy finished in the background: each process copies its share of the memory folders its pod
        holds, and rank 0 commits."""
        if not self.root:
            return None
        loaded = self.loader.load_latest()
        done = self.store.list_committed()
        self.last_committed = done[0] if done else None
        keep = set()
        if loaded:
            keep.add(loaded.step)
            self.last_saved = (loaded.step, loaded.path)
            self.save_seconds = loaded.meta.get("save_seconds", self.save_seconds)
            if not loaded.committed:
                mine = [rf for rf in loaded.held if rf.rank % self.local_world_size == self.local_rank]
                self.copies.start(loaded.step, loaded.path, loaded.meta, mine, started=None)
        if self.rank == 0:  # memory-committed saves this one supersedes
            for _, path in self.store.list_memory_committed():
                if not loaded or path != loaded.path:
                    self.retention.discard(path)
        self._prune_memory(keep)
        return loaded


def _emit_staged(step: int, kind: str, started: float) -> None:
    events.emit(
        contract.EVENT_CHECKPOINT_STAGED, step=step, kind=kind, seconds=round(time.monotonic() - started, 4)
    )


def _on_staged(step: int, kind: str, started: float):
    """A done-callback for the staging Future (it runs in the stager's thread, or here if already done)."""

    def done(fut) -> None:
        if not fut.cancelled() and fut.exception() is None:
            _emit_staged(step, kind, started)

    return done
