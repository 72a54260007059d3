"""`python -m ftjob_trainer.train` (under torchrun): train, save on preemption, resume exactly.

The loop, in order, every step: train one optimizer step -> commit a finished async save -> every few steps
report -> agree with all ranks (one tiny all-reduce) on: stop? checkpoint request? can a save fit the deadline?
-> stop: everybody saves this step, writes the termination message, exits 75 | request/periodic: save, go on.
Loading the latest committed checkpoint is the first thing it does, every time: resume is the default path.
The Trainer owns the loop; stopping.py the stop (signals, the save deadline, the stop save); reporting.py the
report file and the progress posts to the coordinator.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from ftjob_trainer import compile_cache, contract, events
from ftjob_trainer.checkpoint import Checkpointer, NothingLoadable
from ftjob_trainer.checkpoint_save import describe
from ftjob_trainer.config import ConfigError, TrainConfig, parse_args, to_dict
from ftjob_trainer.contract import KIND_FINAL, KIND_PERIODIC, KIND_REQUEST
from ftjob_trainer.data import GlobalBatches, make_source
from ftjob_trainer.engine import state_sha256
from ftjob_trainer.fence import Fence
from ftjob_trainer.preemption import StopSignals, agree, report_error, write_termination_message
from ftjob_trainer.progress import STEP_TIME_KEY, RunProgress
from ftjob_trainer.reporting import Reporter
from ftjob_trainer.startup import build_engine, init_distributed, resume_expected
from ftjob_trainer.stopping import Stopping

log = logging.getLogger("ftjob.train")
REPORT_EVERY_MAX = 10  # the report is rewritten at least this often (issue 3)


class Trainer:
    def __init__(self, cfg: TrainConfig, signals: StopSignals):
        self.cfg = cfg
        self.rank, self.world_size, self.local_rank, self.device = init_distributed()
        # before anything is loaded: a newer world loads what an older one committed before it was fenced
        self.fence = Fence(cfg.preemption.coordinator_url, os.environ.get(contract.ENV_TOKEN), self.rank)
        self.fence.form(self.world_size)
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
            fence=self.fence,
        )
        self.report = Reporter(cfg, self.rank, self.world_size, self.fence)
        self.stopping = Stopping(cfg, signals, self.ckpt, self.report)
        self.handled_request = 0
        self.step: int | None = None  # the last step finished (error reports name it)
        self.ending: dict[str, Any] = {}  # code, reason, message, step: the exit event's fields (terminate())

    # --- helpers ---------------------------------------------------------------------------------------------
    def state_hash(self) -> str:
        model_sd, optim_sd = self.engine.full_state()  # collective: every rank takes part
        return state_sha256(model_sd, optim_sd) if self.rank == 0 else ""

    def meta(self, step: int, reason: str) -> dict:
        return {
            "data_cursor": self.batches.cursor(step),
            "scheduler": self.engine.scheduler.state_dict(),
            "preemption_saves": self.report.doc["preemption_saves"],
            "model": self.cfg.model.model_factory or self.cfg.model.name,
            "global_batch_size": self.cfg.data.global_batch_size,
            "reason": reason,
            STEP_TIME_KEY: self.progress.step_time,  # a resume reports when the step it resumed from was trained
        }

    def global_loss(self, loss: torch.Tensor) -> float:
        t = loss.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG if t.is_cuda else dist.ReduceOp.SUM)
        return float(t) if t.is_cuda else float(t) / self.world_size

    def terminate(self, step: int, reason: str, code: int, message: str) -> int:
        doc = {
            "step": step,
            "checkpoint": self.report.doc["last_checkpoint"],
            "reason": reason,
            "exitCode": code,
            "message": message,
        }
        if self.local_rank == 0:  # one message per pod
            write_termination_message(self.cfg.preemption.termination_log, doc)
        if self.cfg.run.report and code == contract.EXIT_DONE:
            # the hash is of the final state; on a stop it would gather the full state to rank 0 (11.4 GB for 1b)
            # inside the few seconds the operator leaves between the save deadline and torchrun's SIGKILL
            self.report.doc["state_sha256"] = self.state_hash()
        self.report.doc.update(
            step=step, exit_code=code, reason=reason, data_cursor=self.batches.cursor(step)
        )
        self.report.write()
        log.info("exit %d (%s): %s", code, reason, message)
        self.ending = {"code": code, "reason": reason, "message": message, "step": step}
        return code

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
            self.report.doc.update(
                resumed_from_step=step,
                preemption_saves=meta.get("preemption_saves", 0),
                last_checkpoint_step=durable[0] if durable else None,
                last_checkpoint=durable[1] if durable else None,
                memory_only_step=None if loaded.committed else step,
                resumed_tier=loaded.stats.tier(),
            )
            if cfg.run.hash_on_load:
                self.report.doc["loaded_state_sha256"] = self.state_hash()
        self.report.doc.update(step=step, first_step=step + 1, data_cursor=self.batches.cursor(step))
        self.report.write()
        report_every = min(cfg.run.log_every, REPORT_EVERY_MAX)
        tokens_per_step = cfg.data.global_batch_size * cfg.data.seq_len
        self.progress = RunProgress(
            cfg.run.steps, tokens_per_step, step, meta.get(STEP_TIME_KEY), started_at=events.STARTED_AT
        )
        t0, steps_timed = time.perf_counter(), 0
        client = self.report.client  # rank 0's, with a coordinator
        if step < cfg.run.steps:  # a signal during startup or loading: stop before training a step
            agreed = agree(
                self.stopping.signalled(self.step), 0, self.stopping.deficit(), bool(self.fence.fenced)
            )
            if agreed.fenced:
                return self.fenced(step)
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
            self.ckpt.poll()
            self.report.take_commits(self.ckpt)
            if step % report_every == 0 or step == cfg.run.steps:
                value = self.global_loss(loss)
                rate = tokens_per_step * steps_timed / (time.perf_counter() - t0)
                self.report.doc.update(
                    step=step, loss=value, data_cursor=self.batches.cursor(step), tokens_per_second=rate
                )
                if step % cfg.run.log_every == 0:
                    log.info("step %d loss %.4f tokens/s %.0f", step, value, rate)
                    if self.rank == 0:
                        events.emit(contract.EVENT_STEP, step=step, loss=value, tokens_per_s=round(rate, 1))
                self.report.write()
            # the first step of a run too: the operator measures the recovery up to it
            if client and (
                steps_timed == 1 or step % cfg.preemption.progress_every == 0 or step == cfg.run.steps
            ):
                self.report.post_progress(self.progress)
            agreed = agree(
                self.stopping.signalled(self.step),
                client.latest_request if client else 0,
                self.stopping.deficit(),
                bool(self.fence.fenced),
            )
            if agreed.fenced:  # a newer world exists: save nothing, report nothing, restart into it
                return self.fenced(step)
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
                    reason=client.latest_reason if client else None,  # rank 0 polls the coordinator
                    step=step,
                )
                self.ckpt.save(
                    step,
                    self.meta(step, "request"),
                    asynchronous=cfg.checkpoint.async_checkpoint,
                    request_id=agreed.request_id,
                    kind=KIND_REQUEST,
                )
                self.report.take_commits(self.ckpt)
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
                self.report.take_commits(self.ckpt)
        # the last step is done: a final checkpoint (a restarted finished job then has nothing left to do)
        if cfg.checkpoint.checkpoint_dir:  # durable on every rank before exit 0: nothing restarts to copy it
            self.ckpt.drain()
            self.ckpt.save(step, self.meta(step, "final"), kind=KIND_FINAL, durable_now=True)
            self.report.take_commits(self.ckpt)
            if self.fence.active and self.fence.agree(self.ckpt.pg)[1]:  # never exit 0 from a fenced world
                return self.fenced(step)
        return self.terminate(step, contract.REASON_DONE, contract.EXIT_DONE, f"finished all {step} steps")

    def stop(self, step: int, deficit: float) -> int:
        # the step it stops at: the operator counts steps trained twice against it
        self.report.post_progress(self.progress)
        reason, code, message = self.stopping.stop(step, deficit, self.meta)
        if self.fence.fenced:  # its stop save was refused: the newer world's checkpoints count
            return self.fenced(step)
        return self.terminate(step, reason, code, message)

    def fenced(self, step: int) -> int:
        """A newer world exists (fence.py): exit 75 with nothing more committed or reported; the agent
        re-rendezvous into the newer world. No error report: this is not a failure."""
        if not self.fence.fenced:
            self.fence.refuse(None, "peer", "a peer rank learned that a newer world exists")
        message = self.fence.emit(step)
        log.error("%s", message)
        self.report.doc["fenced"] = {"epoch": self.fence.epoch, "newest": self.fence.newest}
        return self.terminate(step, contract.REASON_FENCED, contract.EXIT_RESTART, message)

    def close(self, finished: bool = False) -> None:
        try:
            # never exit with a save half-written in the background
            self.ckpt.close(wait_for_retention=finished)
        except Exception:  # noqa: BLE001 - closing after an error: say so, keep closing
            log.exception("draining the in-flight checkpoint failed; it stays uncommitted")
        self.report.close()


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
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - the exit code and message must say "error"
        if trainer is not None and trainer.fence.stale_now():
            code = _fenced_after_error(cfg, trainer, e)
        else:
            log.exception("training failed")
            # DCP's CheckpointException is a BaseException, and its str() is every rank's traceback
            error = describe(e)
            write_termination_message(cfg.preemption.termination_log, _error_doc(code, error))
            _report_error(cfg, trainer, code, error)
    finally:
        teardown = {}  # seconds: what stands between a stop's commit and this process's exit
        t = time.monotonic()
        if trainer is not None:
            trainer.close(finished=code == contract.EXIT_DONE)
            teardown["close_s"] = round(time.monotonic() - t, 4)
        t = time.monotonic()
        if dist.is_initialized():
            dist.destroy_process_group()
            teardown["process_group_s"] = round(time.monotonic() - t, 4)
        # the last moment: what terminate() decided, or the error
        ending = trainer.ending if trainer is not None and trainer.ending else {}
        _emit_exit(
            code,
            ending.get("reason", contract.REASON_ERROR),
            ending.get("message", error),
            ending.get("step", trainer.step if trainer else None),
            teardown,
        )
    return code


def _fenced_after_error(cfg: TrainConfig, trainer: Trainer, e: Exception) -> int:
    """A stale world's error (say, its save folder removed by the newer world's start) is the fence's doing: exit
    75 as fenced, with no error report (not a failure)."""
    log.warning("stopping on %s: %s, in a fenced world", type(e).__name__, e)
    code, message = contract.EXIT_RESTART, trainer.fence.emit(trainer.step)
    doc = dict(_error_doc(code, message), reason=contract.REASON_FENCED, step=trainer.step)
    write_termination_message(cfg.preemption.termination_log, doc)
    trainer.ending = {
        "code": code,
        "reason": contract.REASON_FENCED,
        "message": message,
        "step": trainer.step,
    }
    return code


def _emit_exit(code: int, reason: str, message: str, step: int | None, teardown: dict | None = None) -> None:
    events.emit(
        contract.EVENT_EXIT,
        code=code,
        reason=reason,
        message=message,
        step=step,
        since_start_s=round(events.since_start(), 4),
        teardown=teardown or {},
    )


def _report_error(cfg: TrainConfig | None, trainer: Trainer | None, code: int, message: str) -> None:
    """Rank 0 writes the report's exit_code and reason. Every rank that stops on a real error tells the coordinator: torchrun restarts it inside the pod (its budget
    stays huge for exit 75), so the operator counts the failure from this report, not from the pod."""
    if trainer is not None:  # the report says how the run ended, an error too
        # what the checkpointer committed or dropped before the error: a stop or final save drains the async save
        # in flight first, and when it then fails, the loop never hands on what that drain finished
        trainer.report.take_commits(trainer.ckpt)
        trainer.report.doc.update(exit_code=code, reason=contract.REASON_ERROR, error=message)
        if trainer.step is not None:
            trainer.report.doc["step"] = trainer.step
        trainer.report.write()
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
