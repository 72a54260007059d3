"""What a worker does before its first step: the process group, and the engine, built on the meta device when a
checkpoint will fill every weight (nothing is initialised only to be overwritten; a fresh start initialises from
the seed as always). train.py runs the loop on top of this.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from ftjob_trainer import contract, events
from ftjob_trainer.checkpoint_load import candidates
from ftjob_trainer.checkpoint_state import any_rank
from ftjob_trainer.checkpoint_store import open_store
from ftjob_trainer.config import TrainConfig
from ftjob_trainer.engine import Engine, build_model


def init_distributed() -> tuple[int, int, int, torch.device]:
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # async DCP saves need a CPU backend next to NCCL
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    started = time.monotonic()
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group(backend)
    else:  # plain `python -m`: a world of one
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    events.set_rank(dist.get_rank())
    events.emit(
        contract.EVENT_PROCESS_GROUP_READY,
        backend=backend,
        world_size=dist.get_world_size(),
        seconds=round(time.monotonic() - started, 4),
    )
    return dist.get_rank(), dist.get_world_size(), local_rank, device


def resume_expected(checkpoint_dir: str | None) -> bool:
    """Collective: does any rank see a checkpoint to resume from (committed, or memory-committed)? If the load
    then finds none it can read, the trainer builds the engine again, initialised (Trainer.run)."""
    mine = bool(checkpoint_dir) and bool(candidates(open_store(checkpoint_dir)))
    return any_rank(dist.group.WORLD if dist.is_initialized() else None, mine)[0]


def build_engine(cfg: TrainConfig, device: torch.device, *, on_meta: bool) -> Engine:
    started = time.monotonic()
    model = build_model(cfg.model, device, cfg.data.seed, on_meta=on_meta)
    params = sum(p.numel() for p in model.parameters())
    engine = Engine(
        model,
        device=device,
        model_cfg=cfg.model,
        opt_cfg=cfg.optimizer,
        par_cfg=cfg.parallel,
        total_steps=cfg.run.steps,
    )
    events.emit(
        contract.EVENT_MODEL_BUILT,
        model=cfg.model.model_factory or cfg.model.name,
        params=params,
        seconds=round(time.monotonic() - started, 4),
        initialised=not engine.built_on_meta,  # False: built on meta, a checkpoint fills it
    )
    return engine
