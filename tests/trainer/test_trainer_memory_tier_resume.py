"""The node-local memory tier under the real torchrun (2 ranks, gloo, one "pod": both share --memory-checkpoint-dir).

- A survivor restart reads its own files from memory: one worker is signalled (SIGTERM: preempted, its files go
  straight to the durable tier; SIGUSR2: a peer goes away, memory is enough), the other stops with it keeping its
  files in memory only; torchrun restarts both; each rank's checkpoint_loaded event says which tier served it;
  the memory-only save becomes durable after the restart; the run ends in the uninterrupted run's state.
- Losing the memory tier (files deleted, corrupted, or a new pod's empty folder) falls back to the newest durable
  checkpoint, and still ends in the uninterrupted run's state.
- Two pods (two agents, one memory folder each, the coordinator's store): the preempted pod's rank writes durably,
  the survivor keeps its files in its own memory, restarts alone, reads its peer's files from the durable tier and
  its own from memory (resharding 2 -> 1), and makes the save durable.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from ftjob_trainer import contract
from trainer_testlib import (
    TINY,
    Procs,
    events_of,
    finish,
    list_steps,
    log_of,
    read_json,
    report_step,
    start_coordinator,
    wait_for,
)

pytestmark = pytest.mark.slow
STEPS = 14
EVERY = ["--checkpoint-every", "3", "--keep-last", "10"]


def args(tmp: Path, name: str, memory: Path) -> list[str]:
    return [
        *TINY,
        "--steps",
        str(STEPS),
        "--checkpoint-dir",
        str(tmp / "ckpt"),
        "--memory-checkpoint-dir",
        str(memory),
        *EVERY,
        "--report",
        str(tmp / f"{name}.json"),
    ]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """STEPS steps uninterrupted, no checkpoints: the reference state."""
    tmp = tmp_path_factory.mktemp("baseline")
    procs = Procs(tmp)
    try:
        p = procs.torchrun([*TINY, "--steps", str(STEPS), "--report", str(tmp / "base.json")], name="base")
        assert finish(p) == 0, log_of(p)[-3000:]
        return read_json(tmp / "base.json")
    finally:
        procs.cleanup()


def of(evs: list[dict], name: str, **fields) -> list[dict]:
    return [e for e in evs if e["event"] == name and all(e.get(k) == v for k, v in fields.items())]


def stop_one_worker(p, sig: int, after: int, durable_first: bool = True) -> int:
    """Once the run is past step `after` (and a periodic save is durable, if durable_first), signal rank 1's
    worker alone (its agent is not told). Returns the pid signalled."""

    def ready():
        evs = events_of(p)
        durable = of(evs, contract.EVENT_CHECKPOINT_COMMITTED, tier=contract.TIER_DURABLE)
        steps = [e["step"] for e in of(evs, contract.EVENT_STEP)]
        return (durable or not durable_first) and steps and max(steps) >= after

    wait_for(ready, timeout=240, proc=p, what=f"a durable periodic save and step {after}")
    (worker,) = of(events_of(p), contract.EVENT_PROCESS_STARTED, rank=1)
    os.kill(worker["pid"], sig)
    return worker["pid"]


@pytest.mark.parametrize(
    ("sig", "rank1_tier"),
    [(signal.SIGTERM, contract.TIER_DURABLE), (signal.SIGUSR2, contract.TIER_MEMORY)],
    ids=["peer-preempted", "peer-goes-away"],
)
def test_survivor_restart_reads_its_files_from_memory_then_makes_them_durable(
    procs, tmp_path, baseline, sig, rank1_tier
):
    memory = tmp_path / "shm"
    # as the operator runs workers: a restarted round must not reuse the previous round's store keys
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    p = procs.torchrun(args(tmp_path, "run", memory), name="run", max_restarts=1, env=env)
    signalled = stop_one_worker(p, sig, after=4)
    assert finish(p, timeout=300) == 0, log_of(p)[-4000:]
    evs = events_of(p)

    # the first incarnation: both ranks stopped at one step; rank 0 (not signalled) kept its files in memory only
    restart_at = min(e["time"] for e in of(evs, contract.EVENT_PROCESS_STARTED, restart_count=1))
    before, after = [e for e in evs if e["time"] < restart_at], [e for e in evs if e["time"] >= restart_at]
    assert of(before, contract.EVENT_STOP_SIGNAL)[0]["pid"] == signalled
    (stop,) = of(before, contract.EVENT_STOP_AGREED, rank=0)
    saved = stop["step"]
    (memory_commit,) = of(before, contract.EVENT_CHECKPOINT_COMMITTED, step=saved)
    assert memory_commit["tier"] == contract.TIER_MEMORY and memory_commit["kind"] == contract.KIND_STOP
    exits = {e["rank"]: e for e in of(before, contract.EVENT_EXIT)}
    assert exits[0]["reason"] == contract.REASON_PEER and exits[0]["code"] == contract.EXIT_RESTART
    assert exits[1]["code"] == contract.EXIT_RESTART

    # the restart: each rank read its shards from where they were (memory for a rank that was not preempted); the
    # small values DCP stores once for all ranks (AdamW's step, ...) come from the durable tier, where every pod
    # can read them
    loaded = {e["rank"]: e for e in of(after, contract.EVENT_CHECKPOINT_LOADED)}
    assert loaded[0]["step"] == loaded[1]["step"] == saved and not loaded[0]["committed"]
    tiers = {0: contract.TIER_MEMORY, 1: rank1_tier}
    for rank, ev in loaded.items():
        by_tier = ev["bytes_by_tier"]
        assert by_tier.get(tiers[rank], 0) > 0.9 * ev["read_bytes"], ev
        assert ev["threads"] >= 1
        # both tiers' files are read straight into the targets, not decoded: most of what the rank read
        # (the rest is the records' framing and the small values DCP decodes)
        assert 0.9 * ev["read_bytes"] < ev["direct_bytes"] <= ev["read_bytes"], ev

    # the memory-only save became durable after the restart: committed by the restarted rank 0
    durable = of(after, contract.EVENT_CHECKPOINT_COMMITTED, step=saved, tier=contract.TIER_DURABLE)
    assert len(durable) == 1 and saved in list_steps(tmp_path / "ckpt")
    final = read_json(tmp_path / "run.json")
    assert final["resumed_from_step"] == saved and final["first_step"] == saved + 1
    assert final["resumed_tier"] in (contract.TIER_MEMORY, contract.TIER_MIXED)
    assert final["last_checkpoint_step"] == STEPS
    assert final["state_sha256"] == baseline["state_sha256"]


def lose(memory: Path, how: str) -> None:
    folders = list(memory.glob("step-*/rank-*"))
    assert folders, "nothing in the memory tier to lose"
    for folder in folders:
        for f in folder.iterdir():
            if how == "deleted":
                f.unlink()
            elif how == "corrupted" and f.suffix in (".distcp", ".pt"):
                f.write_bytes(os.urandom(f.stat().st_size))  # same length: only reading it can tell


@pytest.fixture(scope="module")
def lost_pod(tmp_path_factory) -> tuple[Path, int, int]:
    """A run whose pod is "lost" (no restarts) after rank 1's stop: its last save committed in memory only. Made
    once for the cases below, each of which loses its own copy. Returns (folder, memory-only step, newest durable)."""
    tmp = tmp_path_factory.mktemp("lost-pod")
    procs = Procs(tmp)
    try:
        p = procs.torchrun(args(tmp, "first", tmp / "shm"), name="first")
        stop_one_worker(p, signal.SIGTERM, after=4, durable_first=True)
        finish(p, timeout=300)
        (stop,) = of(events_of(p), contract.EVENT_STOP_AGREED, rank=0)
    finally:
        procs.cleanup()
    saved = stop["step"]
    assert saved not in list_steps(tmp / "ckpt")  # memory-committed only
    durable = max(list_steps(tmp / "ckpt"))
    assert durable < saved
    return tmp, saved, durable


@pytest.mark.parametrize("how", ["deleted", "corrupted", "another-pod"])
def test_losing_the_memory_tier_falls_back_to_the_newest_durable_checkpoint(
    procs, tmp_path, baseline, lost_pod, how
):
    first, saved, durable = lost_pod
    memory = tmp_path / "shm"
    for name in ("ckpt", "shm"):
        shutil.copytree(first / name, tmp_path / name)
    if how == "another-pod":
        memory = tmp_path / "other-shm"
    else:
        lose(memory, how)
    p = procs.torchrun(args(tmp_path, "second", memory), name="second")
    assert finish(p, timeout=300) == 0, log_of(p)[-4000:]
    evs = events_of(p)
    rejected = of(evs, contract.EVENT_CHECKPOINT_REJECTED, step=saved)
    assert rejected and not rejected[0]["committed"]
    loaded = {e["rank"]: e for e in of(evs, contract.EVENT_CHECKPOINT_LOADED)}
    assert {e["step"] for e in loaded.values()} == {durable}
    assert {e["tier"] for e in loaded.values()} == {contract.TIER_DURABLE}
    final = read_json(tmp_path / "second.json")
    assert final["resumed_from_step"] == durable and final["state_sha256"] == baseline["state_sha256"]
    assert not list((tmp_path / "ckpt").glob(f".tmp-step-{saved:09d}"))  # the unreadable save is gone


def test_a_lost_memory_only_save_with_nothing_durable_yet_starts_fresh_from_the_seed(
    procs, tmp_path, baseline
):
    """The model was built on the meta device for the memory-committed save; none loads, so it is built again,
    initialised: the run is the uninterrupted one."""
    memory = tmp_path / "shm"
    first = [
        *args(tmp_path, "first", memory),
        "--checkpoint-every",
        "0",
    ]  # no periodic saves: nothing durable
    p = procs.torchrun(first, name="first")
    stop_one_worker(p, signal.SIGTERM, after=2, durable_first=False)
    finish(p, timeout=300)
    assert not list_steps(tmp_path / "ckpt") and list((tmp_path / "ckpt").glob(".tmp-step-*"))
    lose(memory, "deleted")
    p = procs.torchrun(args(tmp_path, "second", memory), name="second")
    assert finish(p, timeout=300) == 0, log_of(p)[-4000:]
    evs = events_of(p)
    assert {e["initialised"] for e in of(evs, contract.EVENT_MODEL_BUILT)} == {
        False,
        True,
    }  # meta, then rebuilt
    assert len(of(evs, contract.EVENT_FRESH_START)) == 2
    final = read_json(tmp_path / "second.json")
    assert final["resumed_from_step"] is None and final["state_sha256"] == baseline["state_sha256"]


def test_two_pods_a_replacement_that_takes_the_survivors_rank_loads_the_stop_step_not_an_older_one(
    procs, tmp_path, baseline
):
    """a and b (one agent and one memory folder each, the coordinator's store, --nnodes=2:2); a is preempted: its
    rank writes durably, b keeps its files in its memory. A replacement c joins; torchrun orders ranks by (address,
    agent pid), so b (lower pid) becomes rank 0 and c takes b's old rank, whose files are only in b's memory. b
    copies them to the durable tier before the load: both resume from the stop step, and end in the uninterrupted
    run's state."""
    _, ports = start_coordinator(procs, "t0ken")
    rdzv = [
        "--nnodes=2:2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{ports['storePort']}",
        "--rdzv-id=job-memory",
        "--rdzv-conf=is_host=0,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2,join_timeout=120",
        "--monitor-interval=0.2",
    ]

    def agent(name: str):
        env = {
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "FTJOB_TERMINATION_LOG": str(tmp_path / f"{name}.term"),
        }
        argv = args(tmp_path, name, tmp_path / f"shm-{name}")  # one memory folder per pod
        return procs.torchrun(argv, name=name, nproc=1, env=env, rdzv=rdzv, max_restarts=3)

    agents = {"a": agent("a"), "b": agent("b")}

    def rank_of(name: str) -> int | None:
        started = of(events_of(agents[name]), contract.EVENT_PROCESS_GROUP_READY)
        return started[0]["rank"] if started else None

    wait_for(lambda: rank_of("a") is not None and rank_of("b") is not None, timeout=180, what="both ranks")
    assert (rank_of("a"), rank_of("b")) == (0, 1)  # a's agent started first: the lower pid sorts first
    wait_for(
        lambda: any(report_step(tmp_path / f"{n}.json") >= 5 for n in agents), timeout=180, what="step 5"
    )
    os.kill(agents["a"].pid, signal.SIGTERM)  # the agent: it forwards SIGTERM to its worker, as in a pod
    assert finish(agents["a"]) != 0
    agents["c"] = agent("c")  # the replacement pod
    assert finish(agents["b"], timeout=300) == 0, log_of(agents["b"])[-4000:]
    assert finish(agents["c"], timeout=300) == 0, log_of(agents["c"])[-4000:]
    saved = of(events_of(agents["a"]), contract.EVENT_STOP_AGREED)[0]["step"]
    b, c = events_of(agents["b"]), events_of(agents["c"])
    assert of(b, contract.EVENT_EXIT)[0]["reason"] == contract.REASON_PEER
    restarted = of(b, contract.EVENT_PROCESS_STARTED, restart_count=1)[0]["pid"]
    (b_loaded,) = [e for e in of(b, contract.EVENT_CHECKPOINT_LOADED) if e["pid"] == restarted]
    (c_loaded,) = of(c, contract.EVENT_CHECKPOINT_LOADED)
    assert (b_loaded["rank"], c_loaded["rank"]) == (0, 1)  # b's rank moved
    assert b_loaded["step"] == c_loaded["step"] == saved and not c_loaded["committed"]
    assert not of(b + c, contract.EVENT_CHECKPOINT_REJECTED)  # made durable first, not discarded
    assert saved in list_steps(tmp_path / "ckpt")
    final = read_json(tmp_path / "b.json")
    assert final["resumed_from_step"] == saved and final["state_sha256"] == baseline["state_sha256"]
