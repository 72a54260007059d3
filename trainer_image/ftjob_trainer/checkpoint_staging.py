"""Async staging of the checkpoint state into host memory: what this torch supports, a stager that stays usable
for every save of the job (its pinned buffers are allocated once), and the checks on what may be staged."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
import torch.distributed.checkpoint as dcp


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
