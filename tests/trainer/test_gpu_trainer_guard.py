"""GPU only (the device machine): the seed's crash and the guard that prevents it.

FSDP2 + CPUOffloadPolicy owns parameter placement. Moving such a module with module.to("cuda") before saving (what
verl's engine did, and what the checkpoint guard refuses to do) leaves it half-moved, and the next state_dict()
fails with: Attempted to set the storage of a tensor on device "cpu" to a storage on different device "cuda:0".
With the guard the save and the load go through, for --cpu-offload and for --param-offload (where the move by
hand IS needed, and the params go back to the host after the save)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ftjob_trainer import checkpoint_staging, checkpoint_state
from ftjob_trainer.checkpoint import Checkpointer, needs_manual_param_reload
from ftjob_trainer.config import ModelConfig, OptimizerConfig, ParallelConfig
from ftjob_trainer.engine import Engine, build_model, state_sha256

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
STORAGE_ERROR = r"Attempted to set the storage of a tensor on device .*cpu.* to a storage on different device"


@pytest.fixture
def world_of_one():
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def make(**par) -> Engine:
    device = torch.device("cuda", 0)
    model = build_model(ModelConfig(name="tiny"), device, seed=0)
    return Engine(
        model,
        device=device,
        model_cfg=ModelConfig(name="tiny"),
        opt_cfg=OptimizerConfig(),
        par_cfg=ParallelConfig(**par),
        total_steps=10,
    )


def one_step(engine: Engine) -> None:
    tokens = torch.randint(0, engine.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    engine.train_step([(tokens[:, :-1], tokens[:, 1:])])


def unguarded(engine) -> bool:
    """verl's condition before the fix: move whenever params were offloaded or sit on the CPU."""
    on_cpu = next(engine.model.parameters()).device.type == "cpu"
    return bool(getattr(engine, "_is_offload_param", False)) or on_cpu


def test_seed_crash_reproduces_without_the_guard_on_plain_fsdp2(world_of_one):
    engine = make(cpu_offload=True)
    one_step(engine)
    assert (
        next(engine.model.parameters()).device.type == "cpu"
    )  # CPUOffloadPolicy keeps the shards on the host
    engine.model.to("cuda")  # the move the guard forbids
    with pytest.raises(RuntimeError, match=STORAGE_ERROR):
        engine.model.state_dict()


def test_checkpointer_crashes_with_the_guard_removed(world_of_one, tmp_path, monkeypatch):
    engine = make(cpu_offload=True)
    one_step(engine)
    # the guard is read where the params are moved (checkpoint_state.params_on_device) and in checkpoint_staging.py
    # (Staging: warm_up, and the wait for staging before by-hand offloaded params go back to the host)
    monkeypatch.setattr(checkpoint_state, "needs_manual_param_reload", unguarded)
    monkeypatch.setattr(checkpoint_staging, "needs_manual_param_reload", unguarded)
    with pytest.raises(RuntimeError, match=STORAGE_ERROR):
        Checkpointer(str(tmp_path), 2, engine, 0, 1).save(1, {})


@pytest.mark.parametrize(
    "par", [{"cpu_offload": True}, {"param_offload": True}], ids=["cpu-offload", "param-offload"]
)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_guarded_save_and_load_round_trip(world_of_one, tmp_path, par, asynchronous):
    engine = make(**par)
    one_step(engine)
    seen = []
    if par.get("param_offload"):
        assert needs_manual_param_reload(engine)
        original = engine.load_params_to_device

        def recording_load():
            original()
            seen.append(next(engine.model.parameters()).device.type)

        engine.load_params_to_device = recording_load
    before = state_sha256(*engine.full_state())
    ckpt = Checkpointer(str(tmp_path), 2, engine, 0, 1)
    ckpt.save(1, {"scheduler": engine.scheduler.state_dict()}, asynchronous=asynchronous)
    ckpt.drain()
    assert next(engine.model.parameters()).device.type == "cpu"  # both modes keep params on the host
    if par.get("param_offload"):
        assert seen == ["cuda"]  # moved to the device for the save, then back
    one_step(engine)  # training goes on after the save

    fresh = make(**par)
    loaded = Checkpointer(str(tmp_path), 2, fresh, 0, 1).load_latest()
    assert loaded is not None and loaded.step == 1
    assert state_sha256(*fresh.full_state()) == before
    one_step(fresh)
