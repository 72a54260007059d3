"""Stopping at a step boundary, once every rank agreed to (preemption.agree): this rank's signal (its stop_signal
event, said once), whether a save still fits the deadline, and the stop itself: save the step (durable first when
this pod is preempted), or say why not. Owned by train.Trainer, which writes the exit.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from ftjob_trainer import contract, events
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.config import TrainConfig
from ftjob_trainer.contract import KIND_STOP
from ftjob_trainer.preemption import NO_DEFICIT, StopSignals
from ftjob_trainer.reporting import Reporter

log = logging.getLogger("ftjob.train")
SAVE_MARGIN = 1.2  # a save is started only if 1.2 x its measured duration fits the time left


class Stopping:
    def __init__(self, cfg: TrainConfig, signals: StopSignals, ckpt: Checkpointer, report: Reporter):
        self.cfg, self.signals, self.ckpt, self.report = cfg, signals, ckpt, report
        self.signal_seen = False  # the stop_signal event is emitted once, when the loop first sees the flag

    def signalled(self, step: int | None) -> bool:
        """This rank's stop flag; the first time the loop sees it set, say so (a handler cannot: it only records)."""
        if self.signals.received is None:
            return False
        if not self.signal_seen:
            self.signal_seen = True
            events.emit(
                contract.EVENT_STOP_SIGNAL,
                signal=self.signals.received,
                signal_time=self.signals.wall_at,
                step=step,
                since_signal_s=round(time.monotonic() - self.signals.at, 4),
            )
        return True

    def peer_signalled(self) -> bool:
        """This rank's signal says a peer goes away and this pod stays (--peer-stop-signals)."""
        return self.signals.received in self.cfg.preemption.peer_signal_names()

    def deficit(self) -> float:
        """Seconds by which this rank's save would miss its deadline (<= 0 fits); NO_DEFICIT if not signalled."""
        if self.signals.at is None or (self.peer_signalled() and self.ckpt.memory_root):
            return NO_DEFICIT  # not signalled, or only the memory tier to write
        estimate = self.ckpt.estimate_save_seconds()
        if estimate is None:
            return NO_DEFICIT  # never measured: try (the previous checkpoint stays intact if it is cut short)
        left = self.cfg.checkpoint.save_deadline_seconds - (time.monotonic() - self.signals.at)
        # a background save still writing must be drained first: its remaining time counts too
        return (estimate + self.ckpt.pending_seconds()) * SAVE_MARGIN - left

    def stop(self, step: int, deficit: float, meta: Callable[[int, str], dict]) -> tuple[str, int, str]:
        """Collective: stop at `step`, saving it unless there is nowhere to, it would miss the deadline (`deficit`
        > 0 on some rank) or it is saved already. `meta(step, reason)` is the save's metadata. Returns the exit's
        reason, code and message."""
        # A preempted rank's files must be durable before it exits (its pod's memory goes with the node); a rank
        # stopped with a peer only needs them written (the memory tier), and its restarted worker copies them.
        preempted = (
            self.signalled(step) and not self.peer_signalled()
        )  # signalled(): its event, if not said yet
        reason = contract.REASON_PREEMPTED if preempted else contract.REASON_PEER
        who = f"signal {self.signals.received}" if self.signals.received else "a peer's stop"
        events.emit(
            contract.EVENT_STOP_AGREED,
            step=step,
            reason=reason,
            since_signal_s=round(time.monotonic() - self.signals.at, 4) if self.signals.at else None,
        )
        ck = self.cfg.checkpoint
        if not ck.checkpoint_dir:
            return (
                reason,
                contract.EXIT_RESTART,
                f"stopped at step {step} on {who}; no --checkpoint-dir, nothing saved",
            )
        if deficit > 0:
            self.ckpt.drain()  # an async save already writing may still land
            self.report.take_commits(self.ckpt)
            kept = self.report.doc["last_checkpoint"]
            msg = (
                f"stopped at step {step} on {who}: a save (measured {self.ckpt.estimate_save_seconds():.1f}s) would "
                f"miss the {ck.save_deadline_seconds:.0f}s deadline by {deficit:.1f}s; kept the last committed "
                f"checkpoint {kept}"
            )
            log.warning(msg)
            events.emit(
                contract.EVENT_CHECKPOINT_SKIPPED,
                step=step,
                kind=KIND_STOP,
                reason="deadline",
                estimate_s=self.ckpt.estimate_save_seconds(),
                deficit_s=round(deficit, 4),
                kept=kept,
            )
            return contract.REASON_DEADLINE, contract.EXIT_RESTART, msg
        t = time.monotonic()
        # an async save submitted at this very step (the same on every rank): the stop save below finishes it
        pending = self.ckpt.inflight is not None and self.ckpt.inflight.step == step
        self.ckpt.drain()  # before the collective: DCP's background write still uses the checkpointer's group
        if not pending and self.ckpt.saved_everywhere(step):  # e.g. stopped right after resuming
            last = self.ckpt.last_saved
            if preempted:  # what this pod holds only in memory must reach the durable tier first
                left = ck.save_deadline_seconds - (time.monotonic() - (self.signals.at or t))
                self.ckpt.wait_own_files_durable(timeout=max(0.0, left))
            self.report.take_commits(self.ckpt)
            said = "committed" if last == self.ckpt.last_committed else "saved (memory-committed)"
            if preempted:
                self.tell_launcher_if_committed(step)
            events.emit(
                contract.EVENT_CHECKPOINT_SKIPPED,
                step=step,
                kind=KIND_STOP,
                reason="already-committed",
                kept=last[1],
            )
            return (
                reason,
                contract.EXIT_RESTART,
                f"stopped at step {step} on {who}; this step is already {said} as {last[1]}",
            )
        self.report.doc["preemption_saves"] += 1
        path = self.ckpt.save(step, meta(step, reason), kind=KIND_STOP, durable_now=preempted)
        if preempted:  # first: a replacement's round waits for this agent to leave
            self.tell_launcher_if_committed(step)
        self.report.take_commits(self.ckpt)
        # What the save superseded in this pod's memory stays: a preempted pod's memory goes with it, and the pod's
        # next worker deletes it in the background after its load. Deleting it here held up the exit (~1.2 s for
        # 11 GB), which a survivor's restart and a replacement that waits for this process both wait for.
        since = (
            f"{time.monotonic() - self.signals.at:.2f}s after the signal" if self.signals.at else "on request"
        )
        return (
            reason,
            contract.EXIT_RESTART,
            f"stopped at step {step} on {who}; saved {path} in {time.monotonic() - t:.2f}s ({since})",
        )

    def tell_launcher_if_committed(self, step: int) -> None:
        """A preempted pod's stop checkpoint is durable: its launcher's agent may leave the rendezvous now, before
        this process's teardown (launch.py). A step only memory-committed, or refused by the fence, says nothing."""
        path = os.environ.get(contract.ENV_STOP_COMMITTED_FILE)
        committed = self.ckpt.last_committed
        if not path or committed is None or committed[0] != step:
            return
        try:
            with open(path, "a"):
                pass
        except OSError as e:  # the agent then leaves when this process exits, as without the file
            log.warning("could not tell the launcher that step %d is committed (%s)", step, e)
