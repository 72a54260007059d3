"""The real engine in this process, for tests of the checkpointer without torchrun: the tiny preset on the CPU,
seeded, and one training step on tokens drawn from the step number (the same step trains the same batch)."""

from __future__ import annotations

import torch
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.config import ModelConfig, OptimizerConfig, ParallelConfig
from ftjob_trainer.engine import Engine, build_model


def tiny_engine(total_steps: int = 20) -> Engine:
    cfg = ModelConfig(name="tiny")
    return Engine(
        build_model(cfg, torch.device("cpu"), seed=0),
        device=torch.device("cpu"),
        model_cfg=cfg,
        opt_cfg=OptimizerConfig(),
        par_cfg=ParallelConfig(),
        total_steps=total_steps,
    )


def train_step(engine: Engine, ckpt: Checkpointer, step: int) -> None:
    tokens = torch.randint(0, engine.vocab_size, (2, 17), generator=torch.Generator().manual_seed(step))
    engine.train_step([(tokens[:, :-1], tokens[:, 1:])], before_optimizer=ckpt.wait_for_staging)
