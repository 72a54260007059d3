"""Sharded, atomically committed DCP checkpoints across ranks, in two tiers, and the events of saves.

A save writes each rank's files into its pod's memory tier (--memory-checkpoint-dir) when there is one, or straight
into the durable folder (.tmp-step-N/ under --checkpoint-dir) when there is none or when this rank's files must be
durable before save() returns: a preempted pod's stop save (its memory goes with the node) and the final save.
Once every rank's files are written, rank 0 writes ftjob.json into .tmp-step-N/: the memory commit (resumable by a
world that can read every file it needs). Memory folders are then copied to the durable folder in the background
(memory_tier.DurableCopy) and rank 0 renames the folder once every rank's files are durable: the commit. A save
whose files all went straight to the durable folder commits at once. take_commits() hands the loop each commit,
memory first, then durable: only durable ones may be reported as the job's lastCheckpoint.

Here: `Checkpointer` (when to save, what is saved where). Elsewhere: how the state reaches DCP, under the seed's
guard, and what this torch can stage checkpoint_staging.py; one save's files, markers and commit record
checkpoint_save.py; loading checkpoint_load.py; the durable copy checkpoint_copy.py; the on-disk layout, commit and
retention checkpoint_layout.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from ftjob_trainer import contract, events, memory_tier
from ftjob_trainer.checkpoint_copy import Commit, DurableCopies
from ftjob_trainer.checkpoint_layout import Retention, committed_name
from ftjob_trainer.checkpoint_load import Loaded, Loader, NothingLoadable  # noqa: F401 - re-exported
from ftjob_trainer.checkpoint_save import (
    Failure,
    InFlight,
    SaveFailed,
    agree_save,
    discard,
    open_files,
    report_failure,
    save_meta,
)
from ftjob_trainer.checkpoint_staging import Staging
from ftjob_trainer.checkpoint_state import (  # noqa: F401 - the guard, re-exported (the seed's tests import it here)
    any_rank,
    needs_manual_param_reload,
)
from ftjob_trainer.checkpoint_store import open_store
from ftjob_trainer.contract import KIND_FINAL, KIND_PERIODIC, KIND_STOP, TIER_DURABLE, TIER_MEMORY
from ftjob_trainer.fence import Fence

log = logging.getLogger(__name__)


class Checkpointer:
    """The loop's checkpoints: save (sync or async, memory tier or durable), poll/drain the commits, load the
    newest readable one. Collective methods say so: every rank calls them in the same order."""

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
        fence: Fence | None = None,
    ):
        self.root, self.keep_last, self.engine = root, keep_last, engine
        self.fence = fence or Fence(None, None, rank)  # rank 0 asks it before every commit (fence.py)
        self.write_threads, self.read_threads = write_threads, read_threads
        self.rank, self.world_size = rank, world_size
        self.memory_root = memory_root if root else None
        self.local_rank, self.local_world_size = local_rank, max(1, local_world_size)
        self.inflight: InFlight | None = None
        self.last_committed: tuple[int, str] | None = None  # newest durable commit: the one to report
        self.last_saved: tuple[int, str] | None = None  # newest save whose files are all written (any tier)
        self.last_saved_kind: str | None = None
        self._dropped: int | None = (
            None  # a save this rank dropped, until every rank agreed (saved_everywhere)
        )
        self.save_seconds: float | None = None  # measured: last save from start to its durable commit
        self.save_phases: dict = {}
        self.store = open_store(root) if root else None  # a folder, or an object store URL (no memory tier)
        self.retention = Retention(self.store, keep_last) if root else None
        self.copies = DurableCopies(root, rank, self.retention, write_threads, self.fence) if root else None
        self._commits: list[Commit] = []
        self._failures: list[Failure] = []
        self.pruning: threading.Thread | None = None  # deleting superseded memory copies (prune_memory)
        # DCP's collectives run on their own gloo group: an async save's background thread must not share a
        # communicator with the training loop's collectives.
        self.pg = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.staging = Staging(engine, self.pg)
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
        self.engine = self.staging.engine = engine
        if self.root:
            self.loader.engine = engine

    def _barrier(self) -> None:
        if self.pg is not None:
            dist.barrier(group=self.pg)

    def warm_up(self):
        """Allocate the pinned staging buffers now, in the stager's thread, so no first save pays for them (6.5 s
        for 11.4 GB on the H200). Returns the staging Future (None: nothing to warm); its copy only sizes the
        buffers, so it may overlap training steps. Skipped when params are offloaded by hand (their storage
        changes at every move: no buffer could be reused)."""
        return self.staging.warm_up() if self.root else None

    def close(self, wait_for_retention: bool = False) -> None:
        """Drain an in-flight save (no half-written files), stop a durable copy (a restarted worker finishes it),
        release the staging buffers; a finished run also waits for retention's deletions (a stopped one leaves
        them to the next start: its grace period is short)."""
        try:
            self.drain()
        finally:
            self._settle_copy(supersede=True)  # a restarted worker finishes it
            self.staging.close()
            if wait_for_retention:
                self.wait_for_retention()
                self.wait_for_pruning()

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
        self.drain()  # an async save of this very step in flight: finishing it may be enough
        if self.saved_everywhere(step):  # this exact state is saved already
            if kind == KIND_FINAL:  # the job ends here: its last save must be committed, not only copied
                self._settle_copy(supersede=False)
            elif durable_now:
                self.wait_own_files_durable()
            return self.last_saved[1]
        # a newer stop or final save supersedes the durable copy of an older one; any other save waits for it, so
        # the durable tier never falls more than one save behind
        self._settle_copy(supersede=kind in (KIND_STOP, KIND_FINAL))
        started = time.monotonic()
        tmp = self.store.save_path(step)
        # a stale world must not touch the shared folder (the newer world may be saving this very step): ask first
        refused = self.rank == 0 and not self.fence.allows_commit(step)
        if self.rank == 0 and not refused:
            self.store.prepare(tmp)
        direct = durable_now or not self.memory_root
        # also the barrier after rank 0 made the folder
        save_id, all_direct, refused = agree_save(self.pg, self.rank, direct, refused)
        if refused:  # every rank learns it here: all stop at the next step's agreement
            self.fence.refuse(None, "peer", "rank 0's fence check was refused: a newer world exists")
            events.emit(contract.EVENT_CHECKPOINT_SKIPPED, step=step, kind=kind, reason="fenced")
            return None
        error: Exception | None = None
        try:
            write_dir, writer = open_files(
                self.store,
                self.memory_root,
                tmp,
                step,
                self.rank,
                self.world_size,
                direct=direct,
                write_threads=self.write_threads,
            )
        except Exception as e:  # noqa: BLE001 - its first file: a disk the last save filled fails here, on some ranks
            error = e
        # every rank learns it before DCP's collectives, which one rank alone would leave the others waiting in
        if any_rank(self.pg, error is not None)[0]:
            memory_dir = None if direct else memory_tier.rank_dir(self.memory_root, step, self.rank)
            return self._failed(
                step, kind, tmp, memory_dir, error or "it failed on another rank", agreed=True
            )
        meta = save_meta(meta, step, self.world_size, save_id, kind, request_id)
        staging, upload = self.staging.submit(writer, step, kind, started, asynchronous)
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
        done = self._finish_or_drop(synchronous=True)
        return done[1] if done else None

    def _failed(
        self,
        step: int,
        kind: str,
        tmp: str,
        memory_dir: str | None,
        error: BaseException | str,
        agreed: bool = False,
    ) -> None:
        """A save that failed on some rank: its folders go, the last committed save stays. A periodic or requested
        save is dropped and training goes on, as for an async one; a stop or final save raises SaveFailed, so the
        process exits with an error that says what to fix. agreed: every rank calls this now (the first file's
        agreement), so none frees the medium before all judged whether it was full."""
        kept = self.last_committed[1] if self.last_committed else None
        if_full = (
            "size the pod's /dev/shm (the memory tier)"
            if memory_dir
            else "give the checkpoint volume room for --keep-last + 1 checkpoints"
        )
        failure = report_failure(step, kind, error, kept, memory_dir or self.root, if_full)
        # a full /dev/shm would fail every save: the durable tier alone from now on
        if memory_dir and self.memory_root:
            log.warning(
                "memory tier %s disabled after the failure: size the pod's /dev/shm", self.memory_root
            )
            self.memory_root = None
        if agreed:  # a rank whose own error has no errno reads the medium's free space: rank 0 frees it below
            self._barrier()
        discard(self.store, self.rank, tmp, memory_dir)
        self._dropped = step
        if kind in (KIND_STOP, KIND_FINAL):
            raise SaveFailed(failure.message) from (error if isinstance(error, BaseException) else None)
        self._failures.append(failure)

    def saved_everywhere(self, step: int) -> bool:
        """Collective, once this rank's save in flight is finished (drain(): DCP's background write uses the same
        group): whether every rank has `step` saved. Each rank finishes an async save at its own poll(), so a
        marker or commit record that failed on some ranks was dropped by those alone; the others drop it here too.
        Else one rank would skip a save that another makes, or rank 0 wait forever for the durable copy of files
        another rank deleted."""
        assert self.inflight is None, "saved_everywhere() needs the in-flight save finished (drain())"
        mine = self.last_saved is not None and self.last_saved[0] == step
        dropped, unsaved = any_rank(self.pg, self._dropped is not None, not mine)
        dropped_here, self._dropped = self._dropped, None
        if not dropped:
            return not unsaved
        finished = None if dropped_here is not None else self.last_saved  # the save another rank dropped
        if finished and self.copies is not None and self.copies.step == finished[0]:
            self._settle_copy(supersede=True)
        self._barrier()  # no rank writes into the dropped save's folder any more
        if self.rank == 0:  # (again, if it dropped it itself: another rank's copy may have written since)
            self.store.discard(self.store.save_path(dropped_here if finished is None else finished[0]))
        if finished:
            done = self.store.list_committed()
            self.last_committed = done[0] if done else None
            self.last_saved = self.last_committed
            kept = self.last_committed[1] if self.last_committed else None
            error = (
                "another rank could not finish its part of the save (its checkpoint_skipped event says why)"
            )
            kind = self.last_saved_kind or KIND_PERIODIC
            self._failures.append(report_failure(finished[0], kind, error, kept, None, ""))
        return False

    def wait_for_staging(self) -> None:
        """Called right before optimizer.step(): the staged copy must be complete before params change."""
        if self.inflight and self.inflight.staging is not None:
            self.inflight.staging.result()
            self.inflight.staging = None

    def poll(self) -> None:
        """Non-blocking: finish an async save whose files are written (its memory commit, or its commit), reap a
        finished durable copy (take_commits hands them on). A background save that failed (disk or /dev/shm full,
        a lost peer) is logged and dropped (take_failures): the last save stays the one to resume from."""
        f = self.inflight
        if f is not None and (f.upload is None or f.upload.done()):
            self._finish_or_drop()
        if self.copies is not None and self.copies.done():
            self._settle_copy(supersede=False)

    def take_commits(self) -> list[Commit]:
        out, self._commits = self._commits, []
        return out

    def take_failures(self) -> list[Failure]:
        """The dropped saves since the last call (a stop or final save's failure raises SaveFailed instead)."""
        out, self._failures = self._failures, []
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

    def _finish_or_drop(self, synchronous: bool = False) -> tuple[int, str, int | None] | None:
        """Finish the in-flight save; if its write failed (disk full, a lost peer; DCP tells every rank alike),
        see _failed: the last save stays current and the next one (a stop save) runs."""
        f = self.inflight
        try:
            return self._finish(synchronous=synchronous)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            self._failed(f.step, f.kind, f.tmp, None if f.direct else f.write_dir, e)
            return None

    def _finish(self, *, synchronous: bool) -> tuple[int, str, int | None] | None:
        f = self.inflight
        assert f is not None
        self.inflight = None
        f.wait_written()
        # f.wait_written() raised on every rank alike (DCP gathers each rank's result); a marker or the commit
        # record that does not fit fails on one rank only: see _agree_written
        error: Exception | None = None
        try:
            files = f.seal(self.rank)
        except Exception as e:  # noqa: BLE001 - a full disk, an object store's error: not saved, on every rank
            error = e
        # also the barrier of a sync save: every rank's files are sealed before rank 0 records the save
        self._agree_written(error, synchronous)
        final = os.path.join(self.root, committed_name(f.step))
        path, tier = (final, TIER_DURABLE) if f.all_direct else (f.tmp, TIER_MEMORY)
        elapsed = time.monotonic() - f.started
        # rank 0's rename (or ftjob.json) is the commit, if this world is still the newest (fence.py)
        refused = self.rank == 0 and not self.fence.allows_commit(f.step)
        if self.rank == 0 and not refused:
            try:
                f.record(self.store, path, tier, elapsed)
            except Exception as e:  # noqa: BLE001 - as for the markers above
                error = e
            if f.all_direct and error is None:
                self.retention.apply()
        self._agree_written(error, synchronous)
        if synchronous:  # nobody reports (or exits on) a save before rank 0 recorded it, or was refused
            refused = self.fence.agree(self.pg, refused)[0]
        if refused:  # the newer world owns the shared folder: leave it (its next start cleans it up)
            if not f.direct:
                shutil.rmtree(f.write_dir, ignore_errors=True)  # only this rank's memory folder
            events.emit(contract.EVENT_CHECKPOINT_SKIPPED, step=f.step, kind=f.kind, reason="fenced")
            return None
        f.marks["done"] = time.monotonic() - f.started
        # For a sync save, where its time went (cumulative seconds): state dict + submit, copy to host memory,
        # files written, commit (rank 0), retention. For an async one, when each wait ended.
        self.save_phases = dict(f.marks)
        self.last_saved, self.last_saved_kind = (f.step, path), f.kind
        self._commits.append(Commit(f.step, path, tier, f.request_id, f.kind, elapsed))
        if f.all_direct:
            self.save_seconds, self.last_committed = f.marks["done"], (f.step, final)
        elif f.kind != KIND_STOP:  # after a stop save this process exits: the restarted worker copies
            folders = [] if f.direct else [memory_tier.RankFolder(self.rank, f.write_dir, files)]
            self.copies.start(f.step, f.tmp, f.meta, folders, f.started)
        if f.kind != KIND_STOP:  # after a stop, the pod's next worker prunes (see load_latest)
            self.prune_memory(keep={f.step})
        log.info("checkpoint step %d saved (%s) at %s in %.2fs", f.step, tier, path, f.marks["done"])
        return f.step, path, f.request_id

    def _agree_written(self, error: Exception | None, synchronous: bool) -> None:
        """Raise if this rank's part of the save failed, or, in a sync save, any rank's (a collective): no rank
        goes on to the next collective while another drops the save. An async save is finished by each rank's
        poll() at its own time, so only the rank it failed on drops it (the others count it as saved)."""
        if synchronous and any_rank(self.pg, error is not None)[0] and error is None:
            raise RuntimeError("another rank could not write its part of the save")
        if error is not None:
            raise error

    def _settle_copy(self, *, supersede: bool) -> None:
        done = self.copies.settle(supersede=supersede) if self.copies is not None else None
        if done is not None:
            self.last_committed, self.save_seconds = (done.step, done.path), done.seconds
            self._commits.append(done)

    def wait_own_files_durable(self, timeout: float | None = None) -> bool:
        """A preempted rank whose latest save is memory-committed: wait until the files its pod holds are durable."""
        return self.copies is None or self.copies.wait_own_files_durable(timeout)

    def prune_memory(self, keep: set[int]) -> None:
        """Delete this pod's memory copies of every step but `keep`, in the background: deleting 11 GB of /dev/shm
        took ~1.2 s on the GPU machine, time the loop (after a save) or the restart (after a load) need not wait.
        The folders are chosen now, so a later save's folder is never among them."""
        if self.local_rank != 0:  # one process per pod tidies the pod's memory folder
            return
        folders = memory_tier.superseded(self.memory_root, keep)
        if folders:
            self.wait_for_pruning()  # one at a time: the memory freed in the order it was superseded
            self.pruning = threading.Thread(
                target=memory_tier.remove, args=(folders,), name="ftjob-prune", daemon=True
            )
            self.pruning.start()

    def wait_for_pruning(self) -> None:
        if self.pruning is not None:
            self.pruning.join()
            self.pruning = None

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
        self.prune_memory(keep)
        return loaded
