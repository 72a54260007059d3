"""Async saves with the reused stager (torch 2.11 broke the 2nd save: its DefaultStager closed itself after every
staging, KeyError: <class 'type'>), and the rule that the staged state holds only tensors and plain data.
CPU, a world of one, the real engine and checkpointer; on the GPU machine the same tests run under torch 2.11."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from engine_testlib import tiny_engine, train_step
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.checkpoint_layout import list_committed
from ftjob_trainer.checkpoint_staging import STAGED_ASYNC, non_data_values
from ftjob_trainer.engine import state_sha256


def test_staged_state_holds_only_tensors_and_plain_data(world_of_one, tmp_path):
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path), keep_last=2, engine=engine, rank=0, world_size=1)
    train_step(engine, ckpt, 0)  # AdamW state and the scheduler's initial_lr exist only after a step
    state = ckpt.staging.state()
    assert non_data_values(state) == []
    assert state["optim"]["state"], "the walk must see the optimizer state, not an empty dict"


def test_the_walk_names_classes_functions_and_objects():
    bad = non_data_values(
        {"ok": [torch.zeros(1), 1, 2.0, "s", None, True], "cls": int, "dtype": torch.float32, "fn": len}
    )
    assert sorted(b.split(":")[0] for b in bad) == ["cls", "dtype", "fn"]


def test_a_class_in_the_state_is_refused_before_staging(world_of_one, tmp_path):
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path), keep_last=2, engine=engine, rank=0, world_size=1)
    ckpt.staging.state = lambda: {"model": {"w": torch.zeros(2)}, "optim": {"cls": torch.optim.AdamW}}
    with pytest.raises(TypeError, match=r"optim\.cls"):
        ckpt.save(1, {}, asynchronous=True)


@pytest.mark.skipif(not STAGED_ASYNC, reason="this torch has no staged async_save")
def test_three_async_saves_in_a_row_all_commit(world_of_one, tmp_path):
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path), keep_last=3, engine=engine, rank=0, world_size=1, write_threads=3)
    hashes, stagers = {}, set()
    step = 0
    try:
        for _ in range(3):
            train_step(engine, ckpt, step)
            step += 1
            hashes[step] = state_sha256(*engine.full_state())
            assert ckpt.save(step, {"scheduler": engine.scheduler.state_dict()}, asynchronous=True) is None
            stagers.add(id(ckpt.staging.stager))
            train_step(engine, ckpt, step)  # waits for staging before the optimizer changes the params
            step += 1
            done = ckpt.drain()
            assert done is not None and done[0] == step - 1, f"async save of step {step - 1} did not commit"
    finally:
        ckpt.close()
    assert len(stagers) == 1, "every save must reuse the one stager (its host buffers)"
    committed = list_committed(str(tmp_path))
    assert [s for s, _ in committed] == [5, 3, 1]
    # each committed save holds the state of its own step (staging copied it before the next step changed it)
    for saved_step, path in committed:
        alone = tmp_path / f"alone-{saved_step}"
        shutil.copytree(path, alone / os.path.basename(path))
        fresh = tiny_engine()
        got = Checkpointer(str(alone), keep_last=3, engine=fresh, rank=0, world_size=1).load_latest()
        assert got.step == saved_step and state_sha256(*fresh.full_state()) == hashes[saved_step]


def _fail_inflight_write(ckpt: Checkpointer) -> str:
    """Let the real background write finish, then make its result the failure DCP reports for a write that broke
    (disk full): what poll()/drain() see when a periodic save fails while a SIGTERM arrives."""
    from concurrent.futures import Future

    f = ckpt.inflight
    assert f is not None and f.upload is not None
    f.upload.result()
    failed: Future = Future()
    failed.set_exception(OSError(28, "No space left on device"))
    f.upload = failed
    return f.tmp


@pytest.mark.parametrize("stop_step_same", [False, True], ids=["next-step", "same-step"])
def test_a_failed_inflight_save_does_not_stop_the_preemption_save(world_of_one, tmp_path, stop_step_same):
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path), keep_last=3, engine=engine, rank=0, world_size=1)
    try:
        train_step(engine, ckpt, 0)
        assert ckpt.save(1, {}) is not None
        train_step(engine, ckpt, 1)
        ckpt.save(2, {}, asynchronous=True)
        failed_tmp = _fail_inflight_write(ckpt)
        stop_step = 2
        if not stop_step_same:
            train_step(engine, ckpt, 2)
            stop_step = 3
        # the stop path: a sync save must drop the failed one (logged) and commit its own step
        path = ckpt.save(stop_step, {}, asynchronous=False)
    finally:
        ckpt.close()
    assert path is not None and path.endswith(f"step-{stop_step:09d}")
    assert [s for s, _ in list_committed(str(tmp_path))] == [stop_step, 1]
    if not stop_step_same:
        assert not os.path.exists(failed_tmp), "the failed save's temp dir must be removed"
    assert ckpt.last_committed[0] == stop_step


def test_drain_after_a_failed_inflight_save_keeps_the_last_committed(world_of_one, tmp_path):
    engine = tiny_engine()
    ckpt = Checkpointer(str(tmp_path), keep_last=3, engine=engine, rank=0, world_size=1)
    try:
        train_step(engine, ckpt, 0)
        first = ckpt.save(1, {})
        train_step(engine, ckpt, 1)
        ckpt.save(2, {}, asynchronous=True)
        failed_tmp = _fail_inflight_write(ckpt)
        assert ckpt.drain() is None
    finally:
        ckpt.close()
    assert ckpt.last_committed == (1, first)
    assert not os.path.exists(failed_tmp)
    assert [s for s, _ in list_committed(str(tmp_path))] == [1]
