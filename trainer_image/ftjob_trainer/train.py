"""`python -m ftjob_trainer.train` (under torchrun): train, save on preemption, resume exactly.

The loop, in order, every step: train one optimizer step -> commit a finished async save -> every few steps
report -> agree with all ranks (one tiny all-reduce) on: stop? checkpoint request? can a save fit the deadline?
-> stop: everybody saves this step, writes the termination message, exits 75 | request/periodic: save, go on.
Loading the latest committed checkpoint is the first thing it does, every time: resume is the default path.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from ftjob_trainer import compile_cache, contract, events
from ftjob_trainer.checkpoint import Checkpointer, Commit, NothingLoadable
from ftjob_trainer.config import ConfigError, TrainConfig, parse_args, to_dict
from ftjob_trainer.contract import (
    KIND_FINAL,
    KIND_PERIODIC,
    KIND_REQUEST,
    KIND_STOP,
    TIER_DURABLE,
    now_rfc3339,
)
from ftjob_trainer.data import GlobalBatches, make_source
from ftjob_trainer.engine import state_sha256
from ftjob_trainer.preemption import (
    NO_DEFICIT,
    CoordinatorClient,
    StopSignals,
    agree,
    atomic_write_json,
    report_error,
    write_termination_message,
)
from ftjob_trainer.progress import STEP_TIME_KEY, RunProgress
from ftjob_trainer.startup import build_engine, init_distributed, resume_expected

log = logging.getLogger("ftjob.train")
REPORT_EVERY_MAX = 10  # the report is rewritten at least this often (issue 3)
SAVE_MARGIN = 1.2  # a save is started only if 1.2 x its measured duration fits the time left


class Trainer:
    def __init__(self, cfg: TrainConfig, signals: StopSignals):
        self.cfg, self.signals = cfg, signals
        self.rank, self.world_size, self.local_rank, self.device = init_distributed()
        cfg.data.check_world_size(self.world_size)
        ck = cfg.checkpoint
        if cfg.model.compile and ck.compile_cache:  # before anything compiles
            compile_cache.use_checkpoint_volume(ck.checkpoint_dir)
        # a checkpoint will overwrite every weight: build on the meta device, initialise nothing
        self.engine = build_engine(cfg, self.device, on_meta=resume_expected(ck.checkpoint_dir))
        model = self.engine.model
        self.source = make_source(cfg.data, self.engine.vocab_size, getattr(model, "encode_text", None))
        self.ckpt = Checkpointer(
            ck.checkpoint_dir,
            ck.keep_last,
            self.engine,
            self.rank,
            self.world_size,
            write_threads=ck.write_threads,
            read_threads=ck.read_threads,
            memory_root=ck.memory_checkpoint_dir,
            local_rank=self.local_rank,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )
        self.client: CoordinatorClient | None = None
        url = cfg.preemption.coordinator_url
        if url and self.rank == 0:
            self.client = CoordinatorClient(
                url, os.environ.get(contract.ENV_TOKEN), cfg.preemption.poll_interval
            )
        self.report: dict[str, Any] = {
            "step": 0,
            "loss": None,
            "world_size": self.world_size,
            "resumed_from_step": None,
            "preemption_saves": 0,
            "last_checkpoint_step": None,  # durable (on the checkpoint volume)
            "last_checkpoint": None,
            "memory_only_step": None,  # a newer save whose files are written, some only in a pod's memory tier
            "resumed_tier": None,  # where the load read rank 0's files: memory, durable or mixed
            "first_step": None,
            "data_cursor": 0,
            "tokens_per_second": None,
            "state_sha256": None,
            "exit_code": None,
            "reason": None,
        }
        self.handled_request = 0
        self.step: int | None = None  # the last step finished (error reports name it)
        self.signal_seen = False  # the stop_signal event is emitted once, when the loop first sees the flag
        self.ending: dict[str, Any] = {}  # code, reason, message, step: the exit event's fields (terminate())

    # --- helpers ---------------------------------------------------------------------------------------------
    def write_report(self) -> None:
        if self.rank == 0 and self.cfg.run.report:
            atomic_write_json(self.cfg.run.report, dict(self.report, updated_at=now_rfc3339()))

    def state_hash(self) -> str:
        model_sd, optim_sd = self.engine.full_state()  # collective: every rank takes part
        return state_sha256(model_sd, optim_sd) if self.rank == 0 else ""

    def meta(self, step: int, reason: str) -> dict:
        return {
            "data_cursor": self.batches.cursor(step),
            "scheduler": self.engine.scheduler.state_dict(),
            "preemption_saves": self.report["preemption_saves"],
            "model": self.cfg.model.model_factory or self.cfg.model.name,
            "global_batch_size": self.cfg.data.global_batch_size,
            "reason": reason,
            STEP_TIME_KEY: self.progress.step_time,  # a resume reports when the step it resumed from was trained
        }

    def on_commit(self, c: Commit) -> None:
        """Only a durable commit is the job's lastCheckpoint: a memory-only one is lost with its pod."""
        if c.tier != TIER_DURABLE:
            self.report["memory_only_step"] = c.step
            return
        self.report["last_checkpoint_step"], self.report["last_checkpoint"] = c.step, c.path
        if self.report["memory_only_step"] is not None and self.report["memory_only_step"] <= c.step:
            self.report["memory_only_step"] = None
        if self.client:
            fields = {"lastCheckpoint": {"step": c.step, "path": c.path, "time": now_rfc3339()}}
            if c.request_id:
                fields["handledRequestId"] = c.request_id
            self.client.post_progress(**fields)

    def post_progress(self) -> None:
        if self.client:
            self.client.post_progress(**self.progress.document(self.report["loss"], self.world_size))

    def take_commits(self) -> None:
        for c in self.ckpt.take_commits():
            self.on_commit(c)

    def peer_signalled(self) -> bool:
        """This rank's signal says a peer goes away and this pod stays (--peer-stop-signals)."""
        return self.signals.received in self.cfg.preemption.peer_signal_names()

    def global_loss(self, loss: torch.Tensor) -> float:
        t = loss.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG if t.is_cuda else dist.ReduceOp.SUM)
        return float(t) if t.is_cuda else float(t) / self.world_size

    def terminate(self, step: int, reason: str, code: int, message: str) -> int:
        doc = {
            "step": step,
            "checkpoint": self.report["last_checkpoint"],
            "reason": reason,
            "exitCode": code,
            "message": message,
        }
        if self.local_rank == 0:  # one message per pod
            write_termination_message(self.cfg.preemption.termination_log, doc)
        if self.cfg.run.report and code == contract.EXIT_DONE:
            # the hash is of the final state; on a stop it would gather the full state to rank 0 (11.4 GB for 1b)
            # inside the few seconds the operator leaves between the save deadline and torchrun's SIGKILL
            self.report["state_sha256"] = self.state_hash()
        self.report.update(step=step, exit_code=code, reason=reason, data_cursor=self.batches.cursor(step))
        self.write_report()
        log.info("exit %d (%s): %s", code, reason, message)
        self.ending = {"code": code, "reason": reason, "message": message, "step": step}
        return code

    def signalled(self) -> bool:
        """This rank's stop flag; the first time the loop sees it set, say so (a handler cannot: it only records)."""
        if self.signals.received is None:
            return False
        if not self.signal_seen:
            self.signal_seen = True
            events.emit(
                contract.EVENT_STOP_SIGNAL,
                signal=self.signals.received,
                signal_time=self.signals.wall_at,
                step=self.step,
                since_signal_s=round(time.monotonic() - self.signals.at, 4),
            )
        return True

    # --- the loop --------------------------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        loaded = self.ckpt.load_latest()
        if not loaded:
            if self.engine.built_on_meta:  # only memory-committed saves were there, none readable: initialise
                self.engine = build_engine(cfg, self.device, on_meta=False)
                self.ckpt.use_engine(self.engine)
            events.emit(contract.EVENT_FRESH_START, checkpoint_dir=cfg.checkpoint.checkpoint_dir)
        step = loaded.step if loaded else 0
        self.step = step
        meta = loaded.meta if loaded else {}
        self.batches = GlobalBatches(
            self.source,
            cfg.data,
            self.rank,
            self.world_size,
            base_step=step,
            base_cursor=meta.get("data_cursor", 0),
        )
        if loaded:
            durable = self.ckpt.last_committed
            self.report.update(
                resumed_from_step=step,
                preemption_saves=meta.get("preemption_saves", 0),
                last_checkpoint_step=durable[0] if durable else None,
                last_checkpoint=durable[1] if durable else None,
                memory_only_step=None if loaded.committed else step,
                resumed_tier=loaded.stats.tier(),
            )
            if cfg.run.hash_on_load:
                self.report["loaded_state_sha256"] = self.state_hash()
        self.report.update(step=step, first_step=step + 1, data_cursor=self.batches.cursor(step))
        self.write_report()
        report_every = min(cfg.run.log_every, REPORT_EVERY_MAX)
        tokens_per_step = cfg.data.global_batch_size * cfg.data.seq_len
        self.progress = RunProgress(
            cfg.run.steps, tokens_per_step, step, meta.get(STEP_TIME_KEY), started_at=events.STARTED_AT
        )
        t0, steps_timed = time.perf_counter(), 0
        if step < cfg.run.steps:  # a signal during startup or loading: stop before training a step
            agreed = agree(self.signalled(), 0, self.deficit())
            if agreed.stop:
                return self.stop(step, agreed.deficit)
        while step < cfg.run.steps:
            loss = self.engine.train_step(
                self.batches.micro_batches(step), before_optimizer=self.ckpt.wait_for_staging
            )
            step += 1
            self.step = step
            self.progress.step_done(step)
            steps_timed += 1
            if steps_timed == 1:
                events.emit(contract.EVENT_FIRST_STEP, step=step, seconds=round(events.since_start(), 4))
                if cfg.checkpoint.checkpoint_dir:
                    # after one step the optimizer state exists: size the pinned staging buffers in the background
                    self.ckpt.warm_up()
            for c in self.ckpt.poll():
                self.on_commit(c)
            if step % report_every == 0 or step == cfg.run.steps:
                value = self.global_loss(loss)
                rate = tokens_per_step * steps_timed / (time.perf_counter() - t0)
                self.report.update(
                    step=step, loss=value, data_cursor=self.batches.cursor(step), tokens_per_second=rate
                )
                if step % cfg.run.log_every == 0:
                    log.info("step %d loss %.4f tokens/s %.0f", step, value, rate)
                    if self.rank == 0:
                        events.emit(contract.EVENT_STEP, step=step, loss=value, tokens_per_s=round(rate, 1))
                self.write_report()
            # the first step of a run too: the operator measures the recovery up to it
            if self.client and (
                steps_timed == 1 or step % cfg.preemption.progress_every == 0 or step == cfg.run.steps
            ):
                self.post_progress()
            agreed = agree(
                self.signalled(),
                self.client.latest_request if self.client else 0,
                self.deficit(),
            )
            if agreed.stop:
                return self.stop(step, agreed.deficit)
            if not cfg.checkpoint.checkpoint_dir:
                continue
            if agreed.request_id > self.handled_request:
                self.handled_request = agreed.request_id
                log.info("saving step %d for coordinator request %d", step, agreed.request_id)
                events.emit(
                    contract.EVENT_CHECKPOINT_REQUESTED,
                    id=agreed.request_id,
                    reason=self.client.latest_reason if self.client else None,  # rank 0 polls the coordinator
                    step=step,
                )
                self.ckpt.save(
                    step,
                    self.meta(step, "request"),
                    asynchronous=cfg.checkpoint.async_checkpoint,
                    request_id=agreed.request_id,
                    kind=KIND_REQUEST,
                )
                self.take_commits()
            elif (
                cfg.checkpoint.checkpoint_every
                and step % cfg.checkpoint.checkpoint_every == 0
                and step < cfg.run.steps
            ):
                self.ckpt.save(
                    step,
                    self.meta(step, "periodic"),
                    asynchronous=cfg.checkpoint.async_checkpoint,
                    kind=KIND_PERIODIC,
                )
                self.take_commits()
        # the last step is done: a final checkpoint (a restarted finished job then has nothing left to do)
        if cfg.checkpoint.checkpoint_dir:  # durable on every rank before exit 0: nothing restarts to copy it
            self.ckpt.drain()
            self.ckpt.save(step, self.meta(step, "final"), kind=KIND_FINAL, durable_now=True)
            self.take_commits()
        return self.terminate(step, contract.REASON_DONE, contract.EXIT_DONE, f"finished all {step} steps")

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

    def stop(self, step: int, deficit: float) -> int:
        self.post_progress()  # the step it stops at: the operator counts steps trained twice against it
        # A preempted rank's files must be durable before it exits (its pod's memory goes with the node); a rank
        # stopped with a peer only needs them written (the memory tier), and its restarted worker copies them.
        preempted = self.signalled() and not self.peer_signalled()  # signalled(): its event, if not said yet
        reason = contract.REASON_PREEMPTED if preempted else contract.REASON_PEER
        who = f"signal {self.signals.received}" if self.signals.received else "a peer's stop"
        events.emit(
            contract.EVENT_STOP_AGREED,
            step=step,
            reason=reason,
            since_signal_s=round(time.monotonic() - self.signals.at, 4) if self.signals.at else None,
        )
        if not self.cfg.checkpoint.checkpoint_dir:
            return self.terminate(
                step,
                reason,
                contract.EXIT_RESTART,
                f"stopped at step {step} on {who}; no --checkpoint-dir, nothing saved",
            )
        if deficit > 0:
            self.ckpt.drain()  # an async save already writing may still land
            self.take_commits()
            msg = (
                f"stopped at step {step} on {who}: a save (measured {self.ckpt.estimate_save_seconds():.1f}s) would "
                f"miss the {self.cfg.checkpoint.save_deadline_seconds:.0f}s deadline by {deficit:.1f}s; kept the "
                f"last committed checkpoint {self.report['last_checkpoint']}"
            )
            log.warning(msg)
            events.emit(
                contract.EVENT_CHECKPOINT_SKIPPED,
                step=step,
                kind=KIND_STOP,
                reason="deadline",
                estimate_s=self.ckpt.estimate_save_seconds(),
                deficit_s=round(deficit, 4),
                kept=self.report["last_checkpoint"],
            )
            return self.terminate(step, contract.REASON_DEADLINE, contract.EXIT_RESTART, msg)
        t = time.monotonic()
        last = self.ckpt.last_saved
        if last and last[0] == step and self.ckpt.inflight is None:  # e.g. stopped right after resuming
            if preempted:  # what this pod holds only in memory must reach the durable tier first
                left = self.cfg.checkpoint.save_deadline_seconds - (time.monotonic() - (self.signals.at or t))
                self.ckpt.wait_own_files_durable(timeout=max(0.0, left))
            self.take_commits()
            said = "committed" if last == self.ckpt.last_committed else "saved (memory-committed)"
            msg = f"stopped at step {step} on {who}; this step is already {said} as {last[1]}"
            events.emit(
                contract.EVENT_CHECKPOINT_SKIPPED,
                step=step,
                kind=KIND_STOP,
                reason="already-committed",
                kept=last[1],
            )
            return self.terminate(step, reason, contract.EXIT_RESTART, msg)
        self.report["preemption_saves"] += 1
        path = self.ckpt.save(step, self.meta(step, reason), kind=KIND_STOP, durable_now=preempted)
        self.take_commits()
        since = (
            f"{time.monotonic() - self.signals.at:.2f}s after the signal" if self.signals.at else "on request"
        )
        msg = f"stopped at step {step} on {who}; saved {path} in {time.monotonic() - t:.2f}s ({since})"
        return self.terminate(step, reason, contract.EXIT_RESTART, msg)

    def close(self, finished: bool = False) -> None:
        try:
            # never exit with a save half-written in the background
            self.ckpt.close(wait_for_retention=finished)
        except Exception:  # noqa: BLE001 - closing after an error: say so, keep closing
            log.exception("draining the in-flight checkpoint failed; it stays uncommitted")
        if self.client:
            self.client.close()


def setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    events.emit(
        contract.EVENT_PROCESS_STARTED,
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        started_at=round(events.STARTED_AT, 6),
        since_start_s=round(events.since_start(), 4),  # interpreter start and imports
    )
    try:
        cfg = parse_args(argv)
    except ConfigError as e:
        log.error("configuration error: %s", e)
        _report_error(None, None, contract.EXIT_CONFIG_ERROR, f"configuration error: {e}")
        _emit_exit(contract.EXIT_CONFIG_ERROR, contract.REASON_ERROR, f"configuration error: {e}", None)
        return contract.EXIT_CONFIG_ERROR
    signals = StopSignals(
        cfg.preemption.signal_names() + cfg.preemption.peer_signal_names()
    )  # first: a signal during startup is not lost
    log.info("config: %s", to_dict(cfg))
    trainer = None
    code = contract.EXIT_ERROR
    error = ""
    try:
        trainer = Trainer(cfg, signals)
        code = trainer.run()
    except ConfigError as e:
        log.error("configuration error: %s", e)
        code, error = contract.EXIT_CONFIG_ERROR, str(e)
        write_termination_message(cfg.preemption.termination_log, _error_doc(code, error))
        _report_error(cfg, trainer, code, error)
    except NothingLoadable as e:
        log.error("%s", e)
        error = str(e)
        write_termination_message(cfg.preemption.termination_log, _error_doc(code, error))
        _report_error(cfg, trainer, code, error)
    except Exception as e:  # noqa: BLE001 - the exit code and termination message must say "error"
        log.exception("training failed")
        error = f"{type(e).__name__}: {e}"
        write_termination_message(cfg.preemption.termination_log, _error_doc(code, error))
        _report_error(cfg, trainer, code, error)
    finally:
        if trainer is not None:
            trainer.close(finished=code == contract.EXIT_DONE)
        if dist.is_initialized():
            dist.destroy_process_group()
        # the last moment: what terminate() decided, or the error
        ending = trainer.ending if trainer is not None and trainer.ending else {}
        _emit_exit(
            code,
            ending.get("reason", contract.REASON_ERROR),
            ending.get("message", error),
            ending.get("step", trainer.step if trainer else None),
        )
    return code


def _emit_exit(code: int, reason: str, message: str, step: int | None) -> None:
    events.emit(
        contract.EVENT_EXIT,
        code=code,
        reason=reason,
        message=message,
        step=step,
        since_start_s=round(events.since_start(), 4),
    )


def _report_error(cfg: TrainConfig | None, trainer: Trainer | None, code: int, message: str) -> None:
    """Rank 0 writes the report's exit_code and reason. Every rank that stops on a real error tells the coordinator: torchrun restarts it inside the pod (its budget
    stays huge for exit 75), so the operator counts the failure from this report, not from the pod."""
    if trainer is not None:  # the report says how the run ended, an error too
        trainer.report.update(exit_code=code, reason=contract.REASON_ERROR, error=message)
        if trainer.step is not None:
            trainer.report["step"] = trainer.step
        try:
            trainer.write_report()
        except OSError as e:
            log.warning("could not write the report (%s)", e)
    url = cfg.preemption.coordinator_url if cfg else os.environ.get(contract.ENV_COORDINATOR_URL)
    rank = trainer.rank if trainer else int(os.environ.get("RANK", "0"))
    step = trainer.step if trainer else None
    report_error(url, os.environ.get(contract.ENV_TOKEN), rank, code, message, step)


def _error_doc(code: int, message: str) -> dict:
    return {
        "step": None,
        "checkpoint": None,
        "reason": contract.REASON_ERROR,
        "exitCode": code,
        "message": message,
    }


if __name__ == "__main__":
    sys.exit(main())
