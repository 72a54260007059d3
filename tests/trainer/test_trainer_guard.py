"""The checkpoint guard (the seed): bring params to the device around save/load only when the engine offloaded
them by hand, never when FSDP2's CPUOffloadPolicy owns placement; a subclass without the attribute still works.
CPU: the decision, and the real Checkpointer with a real FSDP2 engine in a world of one counting the moves."""

from __future__ import annotations

import pytest
import torch
from ftjob_trainer.checkpoint import Checkpointer, needs_manual_param_reload
from ftjob_trainer.checkpoint_layout import list_committed
from ftjob_trainer.config import ModelConfig, OptimizerConfig, ParallelConfig
from ftjob_trainer.engine import Engine, build_model, state_sha256


class Flags:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


@pytest.mark.parametrize(
    ("attrs", "move"),
    [
        ({"_is_offload_param": True, "_uses_fsdp2_cpu_offload_policy": False}, True),  # by hand: move
        ({"_is_offload_param": True, "_uses_fsdp2_cpu_offload_policy": True}, False),  # FSDP owns placement
        ({"_is_offload_param": False, "_uses_fsdp2_cpu_offload_policy": True}, False),
        ({"_is_offload_param": False, "_uses_fsdp2_cpu_offload_policy": False}, False),
        ({"_is_offload_param": True}, True),  # a subclass that never sets the policy attribute
        ({}, False),  # ... nor the offload one
    ],
)
def test_decision(attrs, move):
    assert needs_manual_param_reload(Flags(**attrs)) is move


class CountingEngine(Engine):
    """Counts the by-hand moves the checkpointer makes."""

    def __init__(self, *a, **kw):
        self.moves: list[str] = []
        super().__init__(*a, **kw)
        self.moves.clear()  # construction offloads once; count only what save/load do

    def load_params_to_device(self):
        self.moves.append("to_device")
        super().load_params_to_device()

    def offload_params_to_host(self):
        self.moves.append("to_host")
        super().offload_params_to_host()


class LegacyEngine(CountingEngine):
    """A subclass written before the policy attribute existed: it never has it."""

    def __getattribute__(self, name):
        if name == "_uses_fsdp2_cpu_offload_policy":
            raise AttributeError(name)
        return super().__getattribute__(name)


def make(cls, *, cpu_offload=False, param_offload=False):
    model = build_model(ModelConfig(name="tiny"), torch.device("cpu"), seed=0)
    return cls(
        model,
        device=torch.device("cpu"),
        model_cfg=ModelConfig(name="tiny"),
        opt_cfg=OptimizerConfig(),
        par_cfg=ParallelConfig(cpu_offload=cpu_offload, param_offload=param_offload),
        total_steps=10,
    )


def one_step(engine):
    tokens = torch.randint(0, engine.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    engine.train_step([(tokens[:, :-1], tokens[:, 1:])])


@pytest.mark.parametrize(
    ("cls", "flags", "moves"),
    [
        (CountingEngine, {"param_offload": True}, ["to_device", "to_host"]),
        (CountingEngine, {"cpu_offload": True}, []),  # the seed's crash: never touch FSDP2's placement
        (CountingEngine, {}, []),
        (LegacyEngine, {"param_offload": True}, ["to_device", "to_host"]),
    ],
    ids=["param-offload", "cpu-offload-policy", "no-offload", "subclass-without-attribute"],
)
def test_save_and_load_move_params_exactly_when_offloaded_by_hand(world_of_one, tmp_path, cls, flags, moves):
    engine = make(cls, **flags)
    one_step(engine)
    before = state_sha256(*engine.full_state())
    ckpt = Checkpointer(str(tmp_path), keep_last=2, engine=engine, rank=0, world_size=1)
    engine.moves.clear()
    path = ckpt.save(1, {"scheduler": engine.scheduler.state_dict()})
    assert engine.moves == moves
    assert list_committed(str(tmp_path)) == [(1, path)]

    fresh = make(cls, **flags)
    assert state_sha256(*fresh.full_state()) != before
    fresh.moves.clear()
    loaded = Checkpointer(str(tmp_path), keep_last=2, engine=fresh, rank=0, world_size=1).load_latest()
    assert loaded.step == 1 and fresh.moves == moves
    assert state_sha256(*fresh.full_state()) == before
