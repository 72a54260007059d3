"""The stop itself (stopping.Stopping), in this process with the real engine, checkpointer and reporter: a
preempted pod's launcher hears of the durable commit before anything else the stop does, such as deleting the older
steps from the memory tier (11 GB of /dev/shm took ~1.2 s on the GPU machine, and a replacement's rendezvous round
waits for the preempted agent to leave)."""

from __future__ import annotations

import os
import signal

from engine_testlib import tiny_engine, train_step
from ftjob_trainer import contract, memory_tier
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.config import parse_args
from ftjob_trainer.preemption import StopSignals
from ftjob_trainer.reporting import Reporter
from ftjob_trainer.stopping import Stopping


def test_a_preempted_stop_tells_its_launcher_before_it_prunes_the_memory_tier(
    world_of_one, tmp_path, monkeypatch
):
    told = tmp_path / "stop-committed"
    monkeypatch.setenv(contract.ENV_STOP_COMMITTED_FILE, str(told))
    cfg = parse_args(
        ["--checkpoint-dir", str(tmp_path / "ckpt"), "--report", str(tmp_path / "r.json")], env={}
    )
    mem = tmp_path / "shm"
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path / "ckpt"), 3, engine, rank=0, world_size=1, memory_root=str(mem))
    train_step(engine, ckpt, 0)
    ckpt.save(1, {}, kind=contract.KIND_PERIODIC)  # memory-committed: its files are in the memory tier only
    assert sorted(os.listdir(mem)) == [os.path.basename(memory_tier.step_dir(str(mem), 1))]
    train_step(engine, ckpt, 1)

    pruned: list[tuple[set[int], bool, list[str]]] = []
    prune = memory_tier.prune

    def watched(root: str | None, keep: set[int]) -> None:
        pruned.append((set(keep), told.exists(), sorted(os.listdir(root))))
        prune(root, keep)

    monkeypatch.setattr(memory_tier, "prune", watched)
    signals = StopSignals(["SIGTERM"])
    try:
        signal.raise_signal(signal.SIGTERM)  # this pod is preempted: its stop save goes to the durable tier
        stopping = Stopping(cfg, signals, ckpt, Reporter(cfg, 0, 1))
        reason, code, _ = stopping.stop(2, deficit=-1.0, meta=lambda step, why: {})
    finally:
        signals.restore()
    assert (reason, code) == (contract.REASON_PREEMPTED, contract.EXIT_RESTART)
    assert ckpt.last_committed is not None and ckpt.last_committed[0] == 2  # durable
    assert told.exists()
    assert pruned, "the stop deletes what its save superseded from the memory tier"
    step_1 = os.path.basename(memory_tier.step_dir(str(mem), 1))
    keep, launcher_knew, held = pruned[0]
    assert keep == {2} and launcher_knew, pruned
    assert step_1 in held, held  # still there when the launcher was told
    assert step_1 not in os.listdir(mem)
