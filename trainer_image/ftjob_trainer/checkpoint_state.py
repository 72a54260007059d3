"""What a checkpoint holds (the engine's model and optimizer state), the guard around reading and writing it, and
the one small collective that saves and loads use to decide together. Below checkpoint.py and checkpoint_load.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict

MODEL_KEY, OPTIM_KEY = "model", "optim"  # top-level keys of the DCP state


def state_of(engine: Any) -> dict:
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    return {MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}


# --- the guard (the seed: verl's FSDP engine crashed saving FSDP2 + CPUOffloadPolicy) --------------------------
def needs_manual_param_reload(engine: Any) -> bool:
    """Bring params to the device around save/load only when the engine offloaded them BY HAND. With FSDP2's
    CPUOffloadPolicy, FSDP owns placement: module.to(cuda) half-moves it and the next state_dict() fails with
    'Attempted to set the storage of a tensor on device "cpu" to a storage on different device "cuda:0"'.
    getattr with a False default: an engine subclass that never sets the attribute still saves correctly."""
    return bool(getattr(engine, "_is_offload_param", False)) and not getattr(
        engine, "_uses_fsdp2_cpu_offload_policy", False
    )


@contextlib.contextmanager
def params_on_device(engine: Any) -> Iterator[None]:
    move = needs_manual_param_reload(engine)
    if move:
        engine.load_params_to_device()
    try:
        yield
    finally:
        if move:
            engine.offload_params_to_host()  # back where the engine keeps them between steps


def any_rank(pg: Any, *flags: bool) -> list[bool]:
    """Collective (gloo, CPU): for each flag, whether it is True on any rank. Without a group, the flags as they are."""
    if pg is None:
        return [bool(f) for f in flags]
    t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg)
    return [bool(v) for v in t.tolist()]
