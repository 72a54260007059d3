"""The stop itself (stopping.Stopping), in this process with the real engine, checkpointer and reporter: a
preempted pod's launcher hears of the durable commit, and the stop leaves the memory tier's older steps alone
(deleting 11 GB of /dev/shm took ~1.2 s on the GPU machine, time the exit waited for); the pod's next worker deletes
them after its load, in the background."""

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


def test_a_preempted_stop_tells_its_launcher_and_leaves_pruning_to_the_pods_next_worker(
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
    step_1 = os.path.basename(memory_tier.step_dir(str(mem), 1))
    assert sorted(os.listdir(mem)) == [step_1]
    train_step(engine, ckpt, 1)

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
    assert ckpt.pruning is None and sorted(os.listdir(mem)) == [step_1]  # left for the next worker
    ckpt.close()

    # the pod's next worker (a container restart keeps the pod's memory): it loads step 2 and deletes step 1
    again = Checkpointer(str(tmp_path / "ckpt"), 3, tiny_engine(), rank=0, world_size=1, memory_root=str(mem))
    loaded = again.load_latest()
    assert loaded is not None and loaded.step == 2
    assert again.pruning is not None, "the superseded step is deleted in the background"
    again.wait_for_pruning()
    assert os.listdir(mem) == []
    again.close()
