"""The durable copy of memory-committed saves, as the checkpointer keeps it: at most one in flight, its commit on
rank 0 once every file the save needs is durable, and the Commit records the loop reports. Below checkpoint.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

from ftjob_trainer import contract, events, memory_tier
from ftjob_trainer.checkpoint_layout import (
    META_FILE,
    Retention,
    commit,
    committed_name,
    dir_bytes,
    needed_files,
)
from ftjob_trainer.contract import TIER_DURABLE, now_rfc3339
from ftjob_trainer.fence import Fence, Fenced

log = logging.getLogger("ftjob_trainer.checkpoint")


@dataclasses.dataclass
class Commit:
    """A save reached a tier: TIER_MEMORY (every rank's files written, some only in their pod's memory; path is the
    .tmp- folder) or TIER_DURABLE (committed on the checkpoint volume; path is step-N/)."""

    step: int
    path: str
    tier: str
    request_id: int | None
    kind: str | None
    seconds: float | None = None  # from the save's start


class DurableCopies:
    """Starts, waits for and cancels the durable copy of a memory-committed save (one at a time)."""

    def __init__(self, root: str, rank: int, retention: Retention, threads: int, fence: Fence):
        self.root, self.rank, self.retention, self.threads = root, rank, retention, threads
        self.fence = fence  # asked before the commit: a stale world's copy is never committed
        self.step: int | None = None
        self.copy: memory_tier.DurableCopy | None = None

    def start(
        self,
        step: int,
        tmp: str,
        meta: dict,
        folders: list[memory_tier.RankFolder],
        started: float | None,
    ) -> None:
        """Copy `folders` (this process's share of the memory copies) into tmp; rank 0 commits. `meta` is the save's
        ftjob.json (save_id, world_size, kind, request_id); started: its monotonic start (None: an earlier process)."""
        kind, request_id = meta.get("kind"), meta.get("request_id")

        def commit_durable() -> Commit:  # rank 0, in the copy's thread, once every needed file is durable
            final = os.path.join(self.root, committed_name(step))
            if not self.fence.allows_commit(step):
                raise Fenced(f"durable copy of step {step} not committed: {self.fence.fenced}")
            with open(os.path.join(tmp, META_FILE)) as fh:
                doc = json.load(fh)
            seconds = time.monotonic() - started if started is not None else doc.get("save_seconds")
            commit(tmp, final, dict(doc, time=now_rfc3339(), save_seconds=seconds))
            events.emit(
                contract.EVENT_CHECKPOINT_COMMITTED,
                step=step,
                path=final,
                bytes=dir_bytes(final),
                seconds=None if seconds is None else round(seconds, 4),
                kind=kind,
                tier=TIER_DURABLE,
                request_id=request_id,
            )
            self.retention.apply()
            return Commit(step, final, TIER_DURABLE, request_id, kind, seconds)

        self.step = step
        self.copy = memory_tier.DurableCopy(
            tmp,
            meta["save_id"],
            step,
            folders,
            threads=self.threads,
            needed=needed_files(tmp, int(meta.get("world_size") or 1)) if self.rank == 0 else None,
            commit=commit_durable if self.rank == 0 else None,
        )

    def done(self) -> bool:
        return self.copy is not None and self.copy.done()

    def settle(self, *, supersede: bool) -> Commit | None:
        """Wait for the copy in flight (supersede: cancel it first; its folder stays memory-committed until the
        next start removes it). Returns its durable commit (rank 0), if it made one."""
        copy, self.copy = self.copy, None
        if copy is None:
            return None
        if supersede:
            copy.cancel()
        try:
            done = copy.result()
        except Fenced as e:  # the folder stays memory-committed: the newer world decides about it
            log.warning("%s", e)
        except memory_tier.CopyCancelled:
            log.info("the durable copy of step %s stopped (superseded, or this process exits)", self.step)
        except Exception as e:  # noqa: BLE001 - the memory commit stays; the next save tries again
            log.error("durable copy of step %s failed (%s: %s)", self.step, type(e).__name__, e)
        else:
            return done if isinstance(done, Commit) else None
        return None

    def wait_own_files_durable(self, timeout: float | None = None) -> bool:
        """Until the memory copies this process copies are durable (a preempted rank must not exit before)."""
        copy = self.copy
        if copy is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while not copy.own_files_durable() and not copy.done():
            if deadline is not None and time.monotonic() > deadline:
                return False
            copy.thread.join(0.05)
        return copy.own_files_durable()
