"""Rank 0's account of a run: the --report file (what tests and benches read: the step, loss, checkpoints, how the
run resumed and how it ended) and the progress posts to the coordinator. Owned by train.Trainer.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ftjob_trainer import contract
from ftjob_trainer.checkpoint_copy import Commit
from ftjob_trainer.checkpoint_save import Failure
from ftjob_trainer.config import TrainConfig
from ftjob_trainer.contract import TIER_DURABLE, now_rfc3339
from ftjob_trainer.preemption import CoordinatorClient, atomic_write_json
from ftjob_trainer.progress import RunProgress

log = logging.getLogger(__name__)


class Reporter:
    """`doc` is the report; `client` the coordinator's (rank 0, when the job has a coordinator)."""

    def __init__(self, cfg: TrainConfig, rank: int, world_size: int, fence: Any = None):
        self.path, self.rank, self.world_size = cfg.run.report, rank, world_size
        self.client: CoordinatorClient | None = None
        self.write_failing = False
        url = cfg.preemption.coordinator_url
        if url and rank == 0:
            self.client = CoordinatorClient(
                url, os.environ.get(contract.ENV_TOKEN), cfg.preemption.poll_interval, fence
            )
        self.doc: dict[str, Any] = {
            "step": 0,
            "loss": None,
            "world_size": world_size,
            "resumed_from_step": None,
            "preemption_saves": 0,
            "last_checkpoint_step": None,  # durable (on the checkpoint volume)
            "last_checkpoint": None,
            "memory_only_step": None,  # a newer save whose files are written, some only in a pod's memory tier
            "last_checkpoint_failure": None,  # the newest dropped save (contract: checkpointFailure)
            "resumed_tier": None,  # where the load read rank 0's files: memory, durable or mixed
            "first_step": None,
            "data_cursor": 0,
            "tokens_per_second": None,
            "state_sha256": None,
            "exit_code": None,
            "reason": None,
        }

    def write(self) -> None:
        """Best effort: the report is an account of the run, not its state; a full volume (it often shares the
        checkpoints') must not stop training. Warned once until a write succeeds again."""
        if self.rank != 0 or not self.path:
            return
        try:
            atomic_write_json(self.path, dict(self.doc, updated_at=now_rfc3339()))
            self.write_failing = False
        except OSError as e:
            if not self.write_failing:
                log.warning("could not write the report %s (%s); training goes on", self.path, e)
            self.write_failing = True

    def on_commit(self, c: Commit) -> None:
        """Only a durable commit is the job's lastCheckpoint: a memory-only one is lost with its pod."""
        if c.tier != TIER_DURABLE:
            self.doc["memory_only_step"] = c.step
            return
        self.doc["last_checkpoint_step"], self.doc["last_checkpoint"] = c.step, c.path
        if self.doc["memory_only_step"] is not None and self.doc["memory_only_step"] <= c.step:
            self.doc["memory_only_step"] = None
        if self.client:
            fields = {"lastCheckpoint": {"step": c.step, "path": c.path, "time": now_rfc3339()}}
            if c.request_id:
                fields["handledRequestId"] = c.request_id
            self.client.post_progress(**fields)

    def on_failure(self, f: Failure) -> None:
        """A dropped save: the operator shows it (condition CheckpointFailing) until a checkpoint newer than
        `kept` commits."""
        doc = {"step": f.step, "kind": f.kind, "message": f.message, "kept": f.kept, "time": f.time}
        self.doc["last_checkpoint_failure"] = doc
        if self.doc["memory_only_step"] == f.step:  # memory-committed here, dropped by another rank
            self.doc["memory_only_step"] = None
        if self.client:
            self.client.post_progress(checkpointFailure=doc)

    def take_commits(self, ckpt: Any) -> None:
        """The commits the checkpointer made, and the saves it dropped, since it was last asked."""
        for c in ckpt.take_commits():
            self.on_commit(c)
        for f in ckpt.take_failures():
            self.on_failure(f)

    def post_progress(self, progress: RunProgress) -> None:
        if self.client:
            self.client.post_progress(**progress.document(self.doc["loss"], self.world_size))

    def close(self) -> None:
        if self.client:
            self.client.close()
