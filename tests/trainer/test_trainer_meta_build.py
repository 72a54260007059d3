"""A model that a checkpoint will fill is built on the meta device and only allocated after sharding: loading it
gives the same state, buffers and training as the model built and initialised on the device; every offload mode
(the seed's guard included) takes that path. A fresh start still initialises from the seed, unchanged."""

from __future__ import annotations

import pytest
import torch
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.config import ModelConfig, OptimizerConfig, ParallelConfig
from ftjob_trainer.engine import Engine, build_model, can_materialise, on_meta_device, state_sha256
from torch import nn

CPU = torch.device("cpu")


def make(*, on_meta=False, **flags) -> Engine:
    cfg = ModelConfig(name="tiny")
    return Engine(
        build_model(cfg, CPU, seed=0, on_meta=on_meta),
        device=CPU,
        model_cfg=cfg,
        opt_cfg=OptimizerConfig(),
        par_cfg=ParallelConfig(**flags),
        total_steps=10,
    )


def step(engine: Engine, seed: int) -> float:
    tokens = torch.randint(0, engine.vocab_size, (2, 17), generator=torch.Generator().manual_seed(seed))
    return float(engine.train_step([(tokens[:, :-1], tokens[:, 1:])]))


def test_build_on_meta_allocates_nothing_and_recomputes_buffers_on_materialise():
    model = build_model(ModelConfig(name="tiny"), CPU, seed=0, on_meta=True)
    assert on_meta_device(model) and model.rope_cos.is_meta
    reference = build_model(ModelConfig(name="tiny"), CPU, seed=0)
    model.init_buffers(CPU)
    assert torch.equal(model.rope_cos, reference.rope_cos) and torch.equal(model.rope_sin, reference.rope_sin)


def test_fresh_builds_are_seeded_and_identical():
    a, b = (build_model(ModelConfig(name="tiny"), CPU, seed=0) for _ in range(2))
    assert not on_meta_device(a)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


@pytest.mark.parametrize(
    "flags",
    [{}, {"cpu_offload": True}, {"param_offload": True}],
    ids=["plain", "cpu-offload", "param-offload"],
)
def test_meta_built_engine_loads_to_the_same_state_and_trains_the_same(world_of_one, tmp_path, flags):
    engine = make(**flags)
    step(engine, 1)
    saved = state_sha256(*engine.full_state())
    Checkpointer(str(tmp_path), keep_last=2, engine=engine, rank=0, world_size=1).save(
        1, {"scheduler": engine.scheduler.state_dict()}
    )
    rng = torch.get_rng_state()

    meta = make(on_meta=True, **flags)
    assert meta.built_on_meta and not on_meta_device(meta.model)
    loaded = Checkpointer(str(tmp_path), keep_last=2, engine=meta, rank=0, world_size=1).load_latest()
    assert loaded.step == 1 and state_sha256(*meta.full_state()) == saved
    torch.set_rng_state(rng)
    assert step(meta, 2) == step(engine, 2)  # same buffers, same math
    assert state_sha256(*meta.full_state()) == state_sha256(*engine.full_state())


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.vocab_size = 8
        self.lin = nn.Linear(4, 8)
        self.register_buffer("table", torch.arange(4.0), persistent=False)  # not in checkpoints


def test_a_model_whose_buffers_cannot_be_recomputed_is_built_on_the_device(monkeypatch):
    import ftjob_trainer.engine as engine_mod

    monkeypatch.setattr(engine_mod, "load_factory", lambda ref, flag: Plain)
    model = build_model(ModelConfig(model_factory="x:y"), CPU, seed=0, on_meta=True)
    assert not on_meta_device(model) and torch.equal(model.table, torch.arange(4.0))
    with torch.device("meta"):
        assert not can_materialise(Plain())
