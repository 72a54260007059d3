"""The training engine: the FSDP2-sharded model, AdamW, the LR schedule, one optimizer step, parameter offload by
hand, and the canonical state hash. The checkpointer and the loop in train.py use it; nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from ftjob_trainer.config import ConfigError, ModelConfig, OptimizerConfig, ParallelConfig
from ftjob_trainer.data import load_factory
from ftjob_trainer.parallelize import parallelize

log = logging.getLogger(__name__)


def lr_lambda(opt: OptimizerConfig, total_steps: int) -> Callable[[int], float]:
    """Linear warmup to 1, then cosine down to min_lr_ratio at total_steps (a pure function of the step)."""

    def f(step: int) -> float:
        if step < opt.warmup_steps:
            return (step + 1) / (opt.warmup_steps + 1)
        span = max(1, total_steps - opt.warmup_steps)
        progress = min(1.0, (step - opt.warmup_steps) / span)
        return opt.min_lr_ratio + (1 - opt.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over all positions, in fp32 (bf16 logits lose too much in the softmax)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build_model(cfg: ModelConfig, device: torch.device, seed: int, *, on_meta: bool = False) -> nn.Module:
    """The full model, initialised from `seed` on `device` (every rank builds the same one; FSDP keeps its shard).

    on_meta (a checkpoint will overwrite every weight): build on the meta device instead, so nothing is allocated
    or initialised; Engine materialises the shards on the device after sharding. A model whose non-persistent
    buffers (not in checkpoints) cannot be recomputed, having no init_buffers(device), is built on the device."""
    torch.manual_seed(seed)
    if cfg.model_factory is None and cfg.hf_path is not None:
        from ftjob_trainer.models.hf import build as build_hf  # transformers only when asked for

        model = build_hf(cfg.hf_path, torch.device("meta") if on_meta else device)
    else:
        model = _build_own(cfg, torch.device("meta") if on_meta else device)
    vocab = getattr(model, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise ConfigError("the model needs an int attribute vocab_size (the size of its output layer)")
    if on_meta and not can_materialise(model):
        log.info(
            "the model has non-persistent buffers and no init_buffers(device): building it on %s", device
        )
        return build_model(cfg, device, seed)
    return model


def _build_own(cfg: ModelConfig, device: torch.device) -> nn.Module:
    """A --model-factory model or a built-in preset, built under `device` (meta: no storage)."""
    with device:
        if cfg.model_factory:
            model = load_factory(cfg.model_factory, "--model-factory")()
            if not isinstance(model, nn.Module):
                raise ConfigError(
                    f"--model-factory={cfg.model_factory} returned {type(model).__name__}, not an nn.Module"
                )
        else:
            from ftjob_trainer.models.llama import build

            model = build(cfg.name)
    return model


def on_meta_device(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def can_materialise(model: nn.Module) -> bool:
    """A model built on meta can be loaded from a checkpoint alone when every buffer the checkpoint lacks (the
    non-persistent ones) can be recomputed by model.init_buffers(device)."""
    non_persistent = any(m._non_persistent_buffers_set for m in model.modules())
    return not non_persistent or callable(getattr(model, "init_buffers", None))


def materialise(model: nn.Module, device: torch.device, *, cpu_offload: bool) -> None:
    """Allocate (uninitialised) storage for a sharded model built on meta, then recompute its non-persistent buffers
    on the compute device. With CPUOffloadPolicy the shards live on the host (FSDP pins them); buffers never do."""
    model.to_empty(device="cpu" if cpu_offload else device)
    init_buffers = getattr(model, "init_buffers", None)
    if callable(init_buffers):
        init_buffers(device)


class Engine:
    """Model + optimizer + schedule. `_is_offload_param` / `_uses_fsdp2_cpu_offload_policy` are what the
    checkpoint guard reads (checkpoint.needs_manual_param_reload)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        device: torch.device,
        model_cfg: ModelConfig,
        opt_cfg: OptimizerConfig,
        par_cfg: ParallelConfig,
        total_steps: int,
    ):
        self.device = device
        self.vocab_size = model.vocab_size
        self._uses_fsdp2_cpu_offload_policy = par_cfg.cpu_offload
        self._is_offload_param = par_cfg.param_offload
        self.flops_per_token = getattr(model, "flops_per_token", None)
        self.model = parallelize(
            model,
            device=device,
            cpu_offload=par_cfg.cpu_offload,
            activation_checkpointing=model_cfg.activation_checkpointing,
            compile=model_cfg.compile,
        )
        self.built_on_meta = on_meta_device(self.model)
        if self.built_on_meta:  # a checkpoint fills in every weight: only allocate the shards
            materialise(self.model, device, cpu_offload=par_cfg.cpu_offload)
        self.opt_cfg = opt_cfg
        # compiled, the fp32 cast, log-softmax and loss fuse: the [tokens, vocab] fp32 logits are never written out
        self.loss_fn = torch.compile(next_token_loss) if model_cfg.compile else next_token_loss
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=opt_cfg.lr,
            betas=(0.9, 0.95),
            weight_decay=opt_cfg.weight_decay,
            # fused on CUDA (each param, grad and moment read once per step); foreach where params live on the CPU
            **({"fused": True} if device.type == "cuda" and not par_cfg.cpu_offload else {"foreach": True}),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(opt_cfg, total_steps))
        if self._is_offload_param:
            self.offload_params_to_host()  # params live on the host between steps

    # --- parameter placement by hand (verl's param_offload) ------------------------------------------------------
    def load_params_to_device(self) -> None:
        self.model.to(self.device)

    def offload_params_to_host(self) -> None:
        self.model.to("cpu")

    # --- one optimizer step ------------------------------------------------------------------------------------
    def train_step(
        self,
        micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
        before_optimizer: Callable[[], None] = lambda: None,
    ) -> torch.Tensor:
        """Forward/backward over the micro-batches, clip, step. Returns the mean loss as a detached device tensor
        (reading it syncs the device, so the caller reads it only now and then)."""
        if self._is_offload_param:
            self.load_params_to_device()
        batches = list(micro_batches)
        total = torch.zeros((), device=self.device)
        for inputs, targets in batches:
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            logits = self.model(inputs)
            loss = self.loss_fn(logits, targets) / len(batches)
            loss.backward()
            total += loss.detach()
        if self.opt_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.opt_cfg.grad_clip, foreach=True)
        before_optimizer()  # an async checkpoint's staging must finish before the params change
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self._is_offload_param:
            self.offload_params_to_host()
        return total

    # --- canonical state hash ------------------------------------------------------------------------------------
    def full_state(self) -> tuple[dict, dict]:
        """Unsharded model and optimizer state on the CPU (rank 0 gets it; other ranks get empty dicts)."""
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (
            get_model_state_dict(self.model, options=opts),
            get_optimizer_state_dict(self.model, self.optimizer, options=opts),
        )


def state_sha256(model_sd: dict, optim_sd: dict) -> str:
    """sha256 over model and optimizer state in sorted-key order; tensors as contiguous fp32 (bf16/fp16 widen
    exactly), scalars as fp64 and hyperparameters as canonical JSON. Equal states give equal hashes whatever
    world size produced them, because the inputs are the unsharded tensors keyed by parameter name."""
    h = hashlib.sha256()

    def add_tensor(name: str, t: torch.Tensor) -> None:
        t = (
            t.detach().cpu()
        )  # full_state() gives plain unsharded tensors (a DTensor here would need a collective)
        t = t.to(torch.float64 if t.dim() == 0 else torch.float32).contiguous()
        h.update(f"{name}|{list(t.shape)}|".encode())
        h.update(t.numpy().tobytes())

    def add(name: str, v) -> None:
        if isinstance(v, torch.Tensor):
            add_tensor(name, v)
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                add(f"{name}.{k}", v[k])
        elif isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                add(f"{name}[{i}]", item)
        else:
            h.update(f"{name}={json.dumps(v, sort_keys=True, default=repr)}|".encode())

    add("model", model_sd)
    add("optim", optim_sd)
    return h.hexdigest()
