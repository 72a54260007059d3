"""How the checkpoint state reaches DCP (`Staging`, under the seed's guard), and async staging into host memory:
what this torch supports, a stager that stays usable for every save of the job (its pinned buffers are allocated
once), and the checks on what may be staged."""

from __future__ import annotations

import contextlib
import inspect
import time
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from ftjob_trainer import contract, events
from ftjob_trainer.checkpoint_state import needs_manual_param_reload, params_on_device, state_of


# --- feature detection (torch 2.13 has staged async_save; torch 2.11 on the GPU machine may not) ----------------
def _staged_async_supported() -> bool:
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # noqa: F401
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse  # noqa: F401
    except ImportError:
        return False
    return "async_stager" in inspect.signature(dcp.async_save).parameters


STAGED_ASYNC = _staged_async_supported()

if STAGED_ASYNC:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    class ReusableStager(DefaultStager):
        """DefaultStager that stays usable for every save of the job, so its pinned host buffers are allocated once.

        torch 2.11's DefaultStager._stage() closes its StateDictStager after each staging: that drops the pinned
        buffers and clears the deepcopy dispatch table, so the 2nd save fails (KeyError: <class 'type'>, the
        first class met while copying any dict). torch 2.13 no longer does it. Same staging, without that close;
        Checkpointer.close() releases the buffers at the end.

        `ready` (a CUDA event recorded by the caller when the state is final) makes the copies wait for the kernels
        that produce the state: the staging stream is a non-blocking one, and the optimizer step that precedes a
        save is usually still running on the GPU when the CPU asks for the save."""

        ready = None

        def _stage(self, state_dict, **kwargs):
            stager = self._state_dict_stager
            if not self._config.use_non_blocking_copy:
                if self.ready is not None:
                    self.ready.synchronize()
                return stager.stage(state_dict, non_blocking=False)
            stream = self._staging_stream
            with stream if stream is not None else contextlib.nullcontext():
                if self.ready is not None:
                    torch.cuda.current_stream().wait_event(self.ready)
                staged = stager.stage(state_dict, non_blocking=True)
            # the copies were only enqueued: wait for them before anyone reads the host buffers
            stream.synchronize() if stream is not None else torch.accelerator.synchronize()
            return staged

    def new_stager() -> ReusableStager:
        """Pinned host buffers on a GPU (allocated by the first staging, reused by every later one)."""
        cuda = torch.cuda.is_available()
        return ReusableStager(
            StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=cuda,
            )
        )


# --- what may be staged -----------------------------------------------------------------------------------------
PLAIN = (str, int, float, bool, type(None))


def non_data_values(state: Any, path: str = "") -> list[str]:
    """Where the state holds something other than tensors, plain scalars/strings and containers of them (a class,
    a function, a dtype, an arbitrary object): such values do not belong in the part DCP stages and writes."""
    if isinstance(state, torch.Tensor) or isinstance(state, PLAIN):
        return []
    if isinstance(state, dict):
        out = []
        for k, v in state.items():
            if not isinstance(k, PLAIN):
                out.append(f"{path}: key {k!r} ({type(k).__name__})")
            out += non_data_values(v, f"{path}.{k}" if path else str(k))
        return out
    if isinstance(state, (list, tuple)):
        return [p for i, v in enumerate(state) for p in non_data_values(v, f"{path}[{i}]")]
    return [f"{path or '<root>'}: {type(state).__name__} {state!r:.80}"]


def state_nbytes(state: dict) -> int:
    """This rank's bytes of tensor data in a state (its local shards)."""
    total = 0

    def walk(v):
        nonlocal total
        if isinstance(v, torch.Tensor):
            local = v.to_local() if hasattr(v, "to_local") else v
            total += local.numel() * local.element_size()
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(state)
    return total


class Staging:
    """Hands the engine's state to DCP, one save at a time: under the guard (params on the device only when the
    engine offloaded them by hand), staged into pinned host buffers that every save reuses when this torch can,
    and checked once for what the stager may deep-copy. Owned by the Checkpointer."""

    def __init__(self, engine: Any, pg: Any):
        self.engine, self.pg = engine, pg
        self.stager = (
            None  # its pinned buffers: allocated by the first save (or warm_up), reused by later ones
        )
        self.state_bytes = 0  # this rank's tensor bytes, measured by the first save

    def state(self) -> dict:
        return state_of(self.engine)

    def _get_stager(self):
        if self.stager is None:
            self.stager = new_stager()
        return self.stager

    def warm_up(self):
        """Size the pinned buffers now (see Checkpointer.warm_up); the staging Future, or None."""
        if not (STAGED_ASYNC and torch.cuda.is_available()):
            return None
        if needs_manual_param_reload(self.engine) or self.stager is not None:
            return None  # by-hand offload, or the buffers already exist
        return self._get_stager().stage(self.state())

    def submit(
        self, writer: Any, step: int, kind: str, started: float, asynchronous: bool
    ) -> tuple[Any, Any]:
        """Collective: start DCP's save of the state into writer. Returns the (staging, upload) Futures; both None
        for a sync save on a torch without staged async_save (it is written when this returns)."""
        with params_on_device(self.engine):
            state = self.state()
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
                staging.add_done_callback(on_staged(step, kind, started))
                if needs_manual_param_reload(self.engine):
                    staging.result()  # the params move back to the host right after this block
            elif not asynchronous:
                dcp.save(state, storage_writer=writer, process_group=self.pg)
                staging = upload = None
            else:  # older torch: async_save stages synchronously (no pinned reuse), then writes in the background
                upload, staging = dcp.async_save(state, storage_writer=writer, process_group=self.pg), None
                emit_staged(step, kind, started)
        return staging, upload

    def close(self) -> None:
        """Release the pinned buffers."""
        if self.stager is not None:
            self.stager.close()
            self.stager = None


def emit_staged(step: int, kind: str, started: float) -> None:
    events.emit(
        contract.EVENT_CHECKPOINT_STAGED, step=step, kind=kind, seconds=round(time.monotonic() - started, 4)
    )


def on_staged(step: int, kind: str, started: float):
    """A done-callback for the staging Future (it runs in the stager's thread, or here if already done)."""

    def done(fut) -> None:
        if not fut.cancelled() and fut.exception() is None:
            emit_staged(step, kind, started)

    return done
