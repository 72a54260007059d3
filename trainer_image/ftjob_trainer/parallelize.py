"""Apply FSDP2 to a model: activation checkpointing and torch.compile per block first, then fully_shard per block,
then on the root (the root holds the embeddings, final norm and output layer).

Order matters: checkpoint/compile wrap the block module before fully_shard installs its hooks on the wrapper, so
FSDP's all-gather and reshard run outside the recomputed/compiled region (torchtitan applies them in this order).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

log = logging.getLogger(__name__)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks to shard on their own: model.shard_units() if the model says, else model.layers, else none."""
    units = getattr(model, "shard_units", None)
    if callable(units):
        return list(units())
    layers = getattr(model, "layers", None)
    if isinstance(layers, (nn.ModuleList, nn.Sequential)):
        return list(layers)
    return []


def stochastic_forward(model: nn.Module) -> bool:
    """Does the forward draw random numbers? The model may say (stochastic_forward), else any active nn.Dropout."""
    said = getattr(model, "stochastic_forward", None)
    return bool(said) or any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())


def _replace_units(model: nn.Module, wrap) -> None:
    """Replace each shard unit in its parent with wrap(unit), keeping its name (so state-dict keys are stable)."""
    targets = {id(u) for u in shard_units(model)}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                parent.register_module(name, wrap(child))


def parallelize(
    model: nn.Module,
    *,
    device: torch.device,
    cpu_offload: bool,
    activation_checkpointing: bool,
    compile: bool,
) -> nn.Module:
    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        # non-reentrant checkpointing: works with FSDP2's hooks and keeps state-dict keys (the wrapper strips its prefix).
        # The recompute must draw the same random numbers as the forward only when the forward draws any (dropout).
        preserve_rng = stochastic_forward(model)
        _replace_units(model, lambda m: checkpoint_wrapper(m, preserve_rng_state=preserve_rng))
    if compile:
        for unit in shard_units(model):
            unit.compile()  # in place: the module keeps its name and parameters
    if device.type == "cuda":
        # bf16 compute, fp32 gradient reduction: the mix FSDP2 users run at scale
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()  # fp32 on CPU: gloo and CPU kernels gain nothing from bf16
    # The engine's device decides the mesh. fully_shard's default mesh is the machine's accelerator, so a model the
    # engine runs on the CPU (tests, --device-less runs on a GPU host) would be moved to cuda behind its back.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs = {"mp_policy": mp, "mesh": mesh}
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    units = shard_units(model)
    # a world of one gathers nothing: resharding after forward would only re-copy and re-cast every block's
    # params in backward
    reshard = dist.get_world_size() > 1
    for i, unit in enumerate(units):
        # the last block's params are needed again right away by backward: keep them gathered
        fully_shard(unit, reshard_after_forward=reshard and i < len(units) - 1, **kwargs)
    fully_shard(model, **kwargs)
    log.info(
        "FSDP2: %d blocks + root sharded (cpu_offload=%s, mp=%s)", len(units), cpu_offload, mp.param_dtype
    )
    return model
