"""Loading the newest checkpoint that every rank of this world can read, from both tiers, falling back together.

Candidates, newest first: committed checkpoints (step-N/, every file durable) and the newest memory-committed save
(.tmp-step-N/ with ftjob.json: every rank's files written, some only in their pod's memory tier). Each rank reads
every file it needs from its pod's memory when the pod holds it intact (memory_tier.held), else from the durable
folder when it is complete there (TieredReader decides per file while DCP plans the load). Every rank must take the
same branch, so each step of an attempt ends with one tiny all-reduce (checkpoint_state.any_rank):
- a committed checkpoint is tried with this pod's memory copies first (when any rank holds some), then from the
  durable tier alone, then set aside (never deleted) and the previous one tried;
- a memory-committed save that some rank cannot read whole (a file only in a pod that is gone, deleted, truncated
  or corrupted) is discarded: the newest committed checkpoint is what this world resumes from.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import set_state_dict

from ftjob_trainer import contract, events, memory_tier
from ftjob_trainer.checkpoint_layout import (
    FAILED_PREFIX,
    Retention,
    needed_files,
    rng_file,
    validate_memory_committed,
)
from ftjob_trainer.checkpoint_save import describe
from ftjob_trainer.checkpoint_staging import state_nbytes
from ftjob_trainer.checkpoint_state import MODEL_KEY, OPTIM_KEY, any_rank, params_on_device, state_of
from ftjob_trainer.shard_io import ReadStats, TieredReader, resolve

log = logging.getLogger("ftjob_trainer.checkpoint")


class NothingLoadable(RuntimeError):
    """Committed checkpoints exist but none loaded: starting fresh would silently throw the job's work away."""


@dataclasses.dataclass
class Loaded:
    step: int
    path: str
    meta: dict
    committed: bool = True  # False: memory-committed; its durable copy is still to be finished
    stats: ReadStats = dataclasses.field(default_factory=ReadStats)
    held: list[memory_tier.RankFolder] = dataclasses.field(default_factory=list)  # this pod's memory copies


def candidates(store: Any) -> list[tuple[int, str, bool]]:
    """(step, folder, committed), newest first: committed checkpoints and memory-committed saves newer than them."""
    committed = store.list_committed()
    newest = committed[0][0] if committed else -1
    pending = [(s, p, False) for s, p in store.list_memory_committed() if s > newest]
    return sorted([(s, p, True) for s, p in committed] + pending, reverse=True)


class Loader:
    def __init__(
        self,
        store: Any,  # checkpoint_store: a folder, or an object store (no memory tier)
        memory_root: str | None,
        engine: Any,
        pg: Any,
        rank: int,
        *,
        read_threads: int,
        write_threads: int = 8,
        retention: Retention,
        local_rank: int = 0,
        local_world_size: int = 1,
    ):
        self.store, self.root = store, store.root
        self.memory_root, self.engine, self.pg, self.rank = memory_root, engine, pg, rank
        self.read_threads, self.write_threads, self.retention = read_threads, write_threads, retention
        self.local_rank, self.local_world_size = local_rank, max(1, local_world_size)

    def load_latest(self) -> Loaded | None:
        """Collective. The newest candidate this world can read, loaded into the engine; None: nothing to load."""
        failures = []
        for step, path, committed in candidates(self.store):
            started = time.monotonic()
            error: BaseException | str | None = None
            meta: dict = {}
            try:
                meta = self.store.validate(path) if committed else validate_memory_committed(path)
            except Exception as e:  # noqa: BLE001 - any failure means: try the previous one
                error = e
            save_id = meta.get("save_id")
            held = memory_tier.held(self.memory_root, step, save_id) if save_id else []
            failed, anyone_holds = any_rank(self.pg, error is not None, bool(held))
            if not failed:
                # memory first where some pod holds copies; a committed one then from the durable tier alone
                attempts = ([True] if anyone_holds else []) + (
                    [False] if committed or not anyone_holds else []
                )
                for use_memory in attempts:
                    loaded, error = self._attempt(step, path, meta, committed, held if use_memory else [])
                    if not loaded and not committed and self._make_durable_first(path, meta, held):
                        loaded, error = self._attempt(step, path, meta, committed, held)  # now from durable
                    if loaded:
                        loaded.held = held
                        self._emit_loaded(loaded, started)
                        return loaded
            reason = describe(error)
            events.emit(
                contract.EVENT_CHECKPOINT_REJECTED, step=step, path=path, error=reason, committed=committed
            )
            any_rank(self.pg, False)  # a barrier: nobody renames a folder another rank still reads
            if committed:
                failures.append(path)
                log.error(
                    "CHECKPOINT LOAD FAILED: %s (%s); falling back to the previous committed checkpoint. "
                    "The directory is kept for inspection as %s*",
                    path,
                    reason,
                    FAILED_PREFIX,
                )
                if self.rank == 0:
                    self.store.set_aside(path, step)
            else:
                log.warning(
                    "memory-committed save %s is not readable by this world (%s); discarding it", path, reason
                )
                if self.rank == 0:
                    self.retention.discard(path)
            any_rank(self.pg, False)
        if failures:
            raise NothingLoadable(
                f"none of the committed checkpoints under {self.root} could be loaded (set aside: {failures}); "
                "refusing to start fresh over them. Inspect or move them away to start over."
            )
        return None

    def _make_durable_first(self, path: str, meta: dict, held: list[memory_tier.RankFolder]) -> bool:
        """Collective. A memory-committed save some rank cannot read whole may still be whole in this world: its
        files in the memory of pods that are here (a survivor whose rank moved: torchrun orders ranks by address,
        and a replacement may sort first). Then every pod copies what it holds to the durable folder now, and the
        save loads from there: no step is lost, and the copy costs what a durable stop save would have cost."""
        sizes = memory_tier.durable_sizes(memory_tier.durable_markers(path, meta["save_id"]))
        have = set(sizes) | set(memory_tier.memory_files(held))
        everyone: list = [have]
        if self.pg is not None:
            everyone = [None] * dist.get_world_size(self.pg)
            dist.all_gather_object(everyone, have, group=self.pg)
        needed = needed_files(path, int(meta.get("world_size") or 1))
        if not set(needed) <= set().union(*everyone):
            return False  # some file is only in a pod that is gone
        mine = [rf for rf in held if rf.rank % self.local_world_size == self.local_rank]
        log.info("copying the memory-committed save %s to the durable tier before loading it", path)
        error = None
        try:
            copy = memory_tier.DurableCopy(
                path, meta["save_id"], meta["step"], mine, threads=self.write_threads
            )
            copy.result()
        except Exception as e:  # noqa: BLE001 - agreed below: the save is then discarded
            error = e
        return not any_rank(self.pg, error is not None)[0]

    def _attempt(
        self, step: int, path: str, meta: dict, committed: bool, held: list[memory_tier.RankFolder]
    ) -> tuple[Loaded | None, BaseException | str | None]:
        saved_world = int(meta.get("world_size") or 1)
        rng_rank = self.rank if self.rank < saved_world else 0  # fewer ranks saved than now run
        error: BaseException | None = None
        if not self.store.tiered:  # an object store: one tier, its files checked by validate()
            reader, rng_path = self.store.reader(path), rng_file(path, rng_rank)
        else:
            memory_files = memory_tier.memory_files(held)
            sizes = None
            if not committed:
                sizes = memory_tier.durable_sizes(memory_tier.durable_markers(path, meta["save_id"]))
            reader = TieredReader(
                path, threads=self.read_threads, memory_files=memory_files, durable_sizes=sizes
            )
            rng_path = None
            try:
                name = os.path.basename(rng_file(path, rng_rank))
                source = resolve(name, 1, path, memory_files, sizes)
                if source is None:
                    raise FileNotFoundError(f"{name} is in neither tier")
                rng_path = os.path.join(source[1], name)
            except Exception as e:  # noqa: BLE001
                error = e
        if any_rank(self.pg, error is not None)[0]:  # before the collective load: all of us, or none
            return None, error or "it failed on another rank"
        try:
            self._load(reader, meta, rng_path)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            error = e
        if any_rank(self.pg, error is not None)[0]:
            return None, error or "it failed on another rank"
        return Loaded(step, path, meta, committed, reader.stats), None

    def _load(self, reader: Any, meta: dict, rng_path: str) -> None:
        with params_on_device(self.engine):
            state = state_of(self.engine)
            dcp.load(state, storage_reader=reader, process_group=self.pg)
            set_state_dict(
                self.engine.model,
                self.engine.optimizer,
                model_state_dict=state[MODEL_KEY],
                optim_state_dict=state[OPTIM_KEY],
            )
        reader.stats.state_bytes = state_nbytes(state)
        if "scheduler" in meta:
            self.engine.scheduler.load_state_dict(meta["scheduler"])
        rng = torch.load(io.BytesIO(self.store.read_bytes(rng_path)), weights_only=True)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])

    def _emit_loaded(self, loaded: Loaded, started: float) -> None:
        s = loaded.stats
        events.emit(
            contract.EVENT_CHECKPOINT_LOADED,
            step=loaded.step,
            path=loaded.path,
            bytes=s.state_bytes,
            seconds=round(s.seconds, 4),
            gbps=round(s.state_bytes / s.seconds / 1e9, 4) if s.seconds > 0 else None,
            read_bytes=s.total_bytes,
            total_s=round(time.monotonic() - started, 4),
            tier=s.tier(),
            files_by_tier=s.files,
            bytes_by_tier=s.bytes,
            threads=s.threads,
            committed=loaded.committed,
            saved_world_size=loaded.meta.get("world_size"),
            direct_bytes=s.direct_bytes,
        )
        log.info(
            "resumed from %s (step %d, saved at world size %s; read %s from the %s tier%s, %d threads)",
            loaded.path,
            loaded.step,
            loaded.meta.get("world_size"),
            s.files,
            s.tier(),
            "" if loaded.committed else ", its durable copy still to finish",
            s.threads,
        )
