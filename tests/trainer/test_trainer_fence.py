"""Fencing a stale world (issue 10): the coordinator's world epochs, its commit check and the refused progress post;
the trainer's Fence against the real control API (in-process); and the real checkpointer refusing to write or commit
once a newer world exists: the durable path, the memory tier and the background durable copy's commit."""

from __future__ import annotations

import os
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from engine_testlib import tiny_engine, train_step
from ftjob_trainer import contract
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.checkpoint_layout import list_committed, list_memory_committed
from ftjob_trainer.coordinator import StaleWorld, State, make_handler
from ftjob_trainer.fence import Fence
from ftjob_trainer.preemption import CoordinatorClient
from trainer_testlib import free_port, http

TOKEN = "s3cret"


# --- the coordinator's epochs ----------------------------------------------------------------------------------
def test_epochs_only_grow_also_across_a_coordinator_restart():
    old = State(clock_ids=True)
    first = old.new_world({"worldSize": 2, "pod": "w-0", "run": "2026-12-03T20:00:00.000000Z"})
    second = old.new_world({"worldSize": 1})
    assert second > first >= 1_700_000_000_000  # milliseconds since the epoch
    while time.time_ns() // 1_000_000 <= second:  # a recreated coordinator starts later than the last epoch
        time.sleep(0.001)
    restarted = State(clock_ids=True)
    assert restarted.new_world({"worldSize": 2}) > second
    with pytest.raises(ValueError, match="worldSize"):
        old.new_world({"worldSize": "2"})
    with pytest.raises(ValueError, match="unknown world fields"):
        old.new_world({"worldSize": 2, "epoch": 1})


def test_the_commit_check_refuses_an_older_world_and_adopts_a_larger_unknown_one():
    state = State()
    older, newest = state.new_world({"worldSize": 1}), state.new_world({"worldSize": 1})
    with pytest.raises(StaleWorld) as refused:
        state.fence({"epoch": older, "step": 4})
    assert (refused.value.epoch, refused.value.newest) == (older, newest)
    assert state.fence({"epoch": newest, "step": 4}) == newest
    # a restarted coordinator knows no epoch: it adopts the largest presented, then refuses anything older
    restarted = State()
    assert restarted.fence({"epoch": older}) == older
    assert restarted.fence({"epoch": newest}) == newest
    with pytest.raises(StaleWorld):
        restarted.fence({"epoch": older})
    assert restarted.snapshot()["worldEpoch"] == newest
    with pytest.raises(ValueError, match="epoch"):
        state.fence({"step": 4})


def test_a_recreated_coordinator_given_its_predecessors_epoch_refuses_older_worlds():
    """The operator passes the newest epoch it read (--min-world-epoch): a stale world presenting first is refused,
    not adopted, and new worlds get epochs above it."""
    old = State(clock_ids=True)
    stale, newest = old.new_world({"worldSize": 1}), old.new_world({"worldSize": 1})
    recreated = State(clock_ids=True, world_epoch=newest)
    with pytest.raises(StaleWorld):
        recreated.fence({"epoch": stale, "step": 9})
    assert recreated.fence({"epoch": newest}) == newest
    assert recreated.new_world({"worldSize": 2}) > newest


def test_a_stale_world_progress_is_refused_and_not_applied():
    state = State()
    older, newest = state.new_world({"worldSize": 1}), state.new_world({"worldSize": 1})
    state.update({"step": 5, "worldEpoch": newest})
    checkpoint = {"step": 6, "path": "/c/step-000000006", "time": "t"}
    with pytest.raises(StaleWorld):
        state.update({"step": 6, "lastCheckpoint": checkpoint, "worldEpoch": older})
    doc = state.snapshot()
    assert doc["step"] == 5 and doc["lastCheckpoint"] is None and doc["worldEpoch"] == newest
    state.update({"step": 7})  # a trainer without a fence (no epoch): applied as before
    assert state.snapshot()["step"] == 7


# --- the HTTP routes and the trainer's Fence ---------------------------------------------------------------------
@pytest.fixture
def api():
    """The coordinator's real control API in this process (its HTTP half; no TCPStore): (base URL, State)."""
    state = State(clock_ids=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state, TOKEN))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_world_and_fence_routes_need_the_token(api):
    base, state = api
    for token in (None, "wrong"):
        assert http("POST", base + contract.ROUTE_WORLD, token, {"worldSize": 1})[0] == 401
        assert http("POST", base + contract.ROUTE_FENCE, token, {"epoch": 1})[0] == 401
    assert state.world_epoch == 0, "a refused request must not hand out an epoch"
    code, first = http("POST", base + contract.ROUTE_WORLD, TOKEN, {"worldSize": 1})
    assert code == 200
    code, second = http("POST", base + contract.ROUTE_WORLD, TOKEN, {"worldSize": 2, "pod": "w-1"})
    assert code == 200 and second["epoch"] > first["epoch"]
    code, doc = http("POST", base + contract.ROUTE_FENCE, TOKEN, {"epoch": first["epoch"], "step": 3})
    assert code == 409 and doc["epoch"] == second["epoch"] and "fenced" in doc["error"]
    assert http("POST", base + contract.ROUTE_FENCE, TOKEN, {"epoch": second["epoch"]}) == (200, second)
    code, doc = http("POST", base + contract.ROUTE_PROGRESS, TOKEN, {"step": 9, "worldEpoch": first["epoch"]})
    assert code == 409 and http("GET", base + contract.ROUTE_PROGRESS, TOKEN)[1]["step"] is None
    assert http("POST", base + contract.ROUTE_FENCE, TOKEN, {"epoch": "x"})[0] == 400


def test_fence_client_against_the_control_api(api):
    base, _ = api
    old = Fence(base, TOKEN, rank=0)
    old.form(world_size=1)  # no process group in this process: rank 0 keeps its own epoch
    assert old.active and old.allows_commit(3) and not old.stale_now()
    new = Fence(base, TOKEN, rank=0)
    new.form(world_size=1)
    assert new.epoch > old.epoch
    assert not old.allows_commit(4)
    assert (old.newest, old.where) == (new.epoch, "commit") and "fenced" in old.fenced
    assert not old.allows_commit(5) and old.stale_now()  # stays fenced
    assert new.allows_commit(4) and not new.stale_now()
    # another process of the old world learns it on an error path
    peer = Fence(base, TOKEN, rank=1)
    peer.epoch = old.epoch
    assert peer.stale_now() and peer.where == "error"


def test_no_coordinator_no_fence_and_a_wrong_token_trains_unfenced(api):
    base, _ = api
    none = Fence(None, None, rank=0)
    none.form(world_size=1)
    assert not none.active and none.allows_commit(1) and not none.stale_now()
    wrong = Fence(base, "wrong", rank=0)
    wrong.form(world_size=1)  # 401 will not change: no retries, no epoch
    assert not wrong.active and wrong.allows_commit(1)


def test_an_unreachable_coordinator_at_commit_time_lets_the_commit_go_on(api, caplog):
    base, _ = api
    fence = Fence(base, TOKEN, rank=0)
    fence.form(world_size=1)
    fence.url = f"http://127.0.0.1:{free_port()}"  # nothing listens there now
    assert fence.allows_commit(7) and not fence.fenced
    assert "committing anyway" in caplog.text


def test_a_refused_progress_post_fences_the_poster(api):
    base, state = api
    old, new = Fence(base, TOKEN, 0), Fence(base, TOKEN, 0)
    old.form(1)
    client = CoordinatorClient(base, TOKEN, interval=60, fence=old)
    new.form(1)
    client.post_progress(step=12, lastCheckpoint={"step": 12, "path": "/c/step-000000012", "time": "t"})
    client.close()  # posts the pending progress
    assert old.where == "progress" and old.newest == new.epoch
    assert state.snapshot()["step"] is None and state.snapshot()["lastCheckpoint"] is None


# --- the checkpointer's commit points ----------------------------------------------------------------------------


def fenced_checkpointer(tmp_path, base: str, memory: bool = False) -> tuple[Checkpointer, Fence]:
    fence = Fence(base, TOKEN, rank=0)
    fence.form(world_size=1)
    engine = tiny_engine()
    mem = str(tmp_path / "shm") if memory else None
    ckpt = Checkpointer(str(tmp_path / "ckpt"), 3, engine, rank=0, world_size=1, memory_root=mem, fence=fence)
    return ckpt, fence


def skipped(events: list[dict]) -> list[int]:
    return [
        e["step"]
        for e in events
        if e["event"] == contract.EVENT_CHECKPOINT_SKIPPED and e["reason"] == "fenced"
    ]


def test_a_stale_world_neither_writes_nor_commits(world_of_one, tmp_path, api, captured_events):
    base, _ = api
    ckpt, fence = fenced_checkpointer(tmp_path, base)
    root = str(tmp_path / "ckpt")
    try:
        train_step(ckpt.engine, ckpt, 0)
        assert ckpt.save(1, {}) is not None  # the newest world commits
        train_step(ckpt.engine, ckpt, 1)
        ckpt.save(2, {}, asynchronous=True)  # in flight when the newer world forms
        Fence(base, TOKEN, 0).form(world_size=1)
        assert ckpt.drain() is None, "the in-flight save must not be committed"
        assert os.path.isdir(os.path.join(root, ".tmp-step-000000002")), "left for the next start to remove"
        train_step(ckpt.engine, ckpt, 2)
        assert ckpt.save(3, {}) is None  # refused before anything is written
        assert not os.path.exists(os.path.join(root, ".tmp-step-000000003"))
    finally:
        ckpt.close()
    assert [s for s, _ in list_committed(root)] == [1] and list_memory_committed(root) == []
    assert ckpt.last_saved[0] == 1 and fence.where == "commit"
    assert skipped(captured_events()) == [2, 3]


def test_the_memory_tier_commit_is_refused(world_of_one, tmp_path, api, captured_events):
    base, _ = api
    ckpt, fence = fenced_checkpointer(tmp_path, base, memory=True)
    try:
        train_step(ckpt.engine, ckpt, 0)
        ckpt.save(1, {}, asynchronous=True)  # into the memory tier
        Fence(base, TOKEN, 0).form(world_size=1)
        assert ckpt.drain() is None
    finally:
        ckpt.close()
    root = str(tmp_path / "ckpt")
    assert list_committed(root) == [] and list_memory_committed(root) == [], "no memory commit (ftjob.json)"
    assert not os.path.exists(tmp_path / "shm" / "step-000000001" / "rank-0"), "this rank's memory files go"
    assert skipped(captured_events()) == [1] and fence.fenced


def test_the_background_durable_copy_is_not_committed_by_a_stale_world(world_of_one, tmp_path, api):
    base, _ = api
    first, _ = fenced_checkpointer(tmp_path, base, memory=True)
    try:  # a stop save: memory-committed, its durable copy left to the next process
        train_step(first.engine, first, 0)
        first.save(1, {}, kind=contract.KIND_STOP)
    finally:
        first.close()
    root = str(tmp_path / "ckpt")
    assert [s for s, _ in list_memory_committed(root)] == [1]
    second, fence = fenced_checkpointer(tmp_path, base, memory=True)
    try:
        Fence(base, TOKEN, 0).form(world_size=1)  # a newer world forms while `second` still runs
        assert second.load_latest().step == 1  # starts the durable copy of step 1; rank 0 commits it
        second._settle_copy(supersede=False)  # waits for the copy: its commit is refused
    finally:
        second.close()
    assert list_committed(root) == [] and [s for s, _ in list_memory_committed(root)] == [1]
    assert fence.where == "commit"
