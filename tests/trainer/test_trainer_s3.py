"""Checkpoints at an object store URL (--checkpoint-dir s3://...), against a real S3-compatible server started
here (moto's server mode, see tests/support/s3_server.py), reached through AWS_ENDPOINT_URL.

In a world of one: the commit marker lists every object with its size, only complete checkpoints count, a save
killed half-way is removed at the next start, retention deletes the marker first, a corrupt newest checkpoint
is set aside and the previous one loads. Under torchrun x2 (gloo): SIGTERM then resume, a SIGKILL frozen in the
middle of an upload then resume, and a corrupted newest checkpoint, each ending in the state of an uninterrupted
run."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from ftjob_trainer.checkpoint import Checkpointer
from ftjob_trainer.checkpoint_layout import META_FILE
from ftjob_trainer.config import ModelConfig, OptimizerConfig, ParallelConfig
from ftjob_trainer.engine import Engine, build_model, state_sha256
from support.s3_server import HoldingRelay, S3Server, objects
from trainer_testlib import TINY, finish, kill_tree, log_of, read_json, report_step, wait_for

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def s3_env(s3, monkeypatch):
    """This process reaches the server as the trainer does: the standard AWS variables."""
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    return s3


# --- the store, in a world of one ------------------------------------------------------------------------------


def make_engine(seed: int = 0) -> Engine:
    cfg = ModelConfig(name="tiny")
    return Engine(
        build_model(cfg, CPU, seed=seed),
        device=CPU,
        model_cfg=cfg,
        opt_cfg=OptimizerConfig(),
        par_cfg=ParallelConfig(),
        total_steps=10,
    )


def one_step(engine: Engine, seed: int) -> None:
    tokens = torch.randint(0, engine.vocab_size, (2, 17), generator=torch.Generator().manual_seed(seed))
    engine.train_step([(tokens[:, :-1], tokens[:, 1:])])


def save(ckpt: Checkpointer, engine: Engine, step: int, **kw) -> str | None:
    return ckpt.save(step, {"scheduler": engine.scheduler.state_dict()}, **kw)


def test_the_marker_lists_every_object_and_a_resume_loads_the_same_state(world_of_one, s3_env):
    url = s3_env.bucket() + "/job"
    engine = make_engine()
    one_step(engine, 1)
    saved = state_sha256(*engine.full_state())
    ckpt = Checkpointer(url, keep_last=2, engine=engine, rank=0, world_size=1)
    path = save(ckpt, engine, 1)
    assert path == f"{url}/step-000000001" and ckpt.store.list_committed() == [(1, path)]
    found = objects(s3_env, path)
    marker = json.loads(s3_env.fs().cat_file(path.removeprefix("s3://") + "/" + META_FILE))
    assert marker["files"] == {k: v for k, v in found.items() if k != META_FILE}
    assert {".metadata", "rng-rank0.pt"} <= set(marker["files"]) and marker["step"] == 1

    fresh = make_engine(seed=5)
    loaded = Checkpointer(url, keep_last=2, engine=fresh, rank=0, world_size=1).load_latest()
    assert loaded.step == 1 and loaded.path == path
    assert state_sha256(*fresh.full_state()) == saved


def test_only_complete_checkpoints_count_and_leftovers_go_at_the_next_start(world_of_one, s3_env):
    url = s3_env.bucket() + "/job"
    fs = s3_env.fs()
    base = url.removeprefix("s3://")
    engine = make_engine()
    ckpt = Checkpointer(url, keep_last=5, engine=engine, rank=0, world_size=1)
    for step in (1, 2, 3):
        one_step(engine, step)
        save(ckpt, engine, step)
    assert [s for s, _ in ckpt.store.list_committed()] == [3, 2, 1]
    # a save killed half-way: objects, no marker
    fs.pipe(f"{base}/step-000000004/__0_0.distcp", b"x" * 100)
    # a committed one that lost an object afterwards, and one with an object cut short
    fs.rm(f"{base}/step-000000003/rng-rank0.pt")
    shard = f"{base}/step-000000002/.metadata"
    fs.pipe(shard, fs.cat_file(shard)[:-1])
    assert [s for s, _ in ckpt.store.list_committed()] == [1]
    again = Checkpointer(url, keep_last=5, engine=make_engine(), rank=0, world_size=1)  # a restart
    assert not [k for k in objects(s3_env, url) if k.startswith("step-000000004/")], "no marker: removed"
    assert again.last_committed == (1, f"{url}/step-000000001")
    assert again.load_latest().step == 1


def test_retention_deletes_the_marker_first_and_keeps_the_newest(world_of_one, s3_env, monkeypatch):
    url = s3_env.bucket() + "/job"
    engine = make_engine()
    ckpt = Checkpointer(url, keep_last=2, engine=engine, rank=0, world_size=1)
    order: list[str] = []
    real_rm = ckpt.store.fs.rm
    monkeypatch.setattr(ckpt.store.fs, "rm", lambda path, **kw: (order.append(path), real_rm(path, **kw))[1])
    for step in (1, 2, 3):
        one_step(engine, step)
        save(ckpt, engine, step)
    ckpt.wait_for_retention()
    assert [s for s, _ in ckpt.store.list_committed()] == [3, 2]
    # (DCP's own rm of .metadata.tmp, its rename on object stores, goes through the same filesystem)
    dropped = [p for p in order if "step-000000001" in p and not p.endswith(".tmp")]
    assert dropped[0].endswith(f"step-000000001/{META_FILE}") and len(dropped) == 2
    assert not [k for k in objects(s3_env, url) if k.startswith("step-000000001")]


def test_a_corrupt_newest_checkpoint_is_set_aside_and_the_previous_one_loads(world_of_one, s3_env):
    url = s3_env.bucket() + "/job"
    fs = s3_env.fs()
    engine = make_engine()
    ckpt = Checkpointer(url, keep_last=3, engine=engine, rank=0, world_size=1)
    one_step(engine, 1)
    save(ckpt, engine, 1)
    at_one = state_sha256(*engine.full_state())
    one_step(engine, 2)
    save(ckpt, engine, 2)
    metadata = url.removeprefix("s3://") + "/step-000000002/.metadata"
    fs.pipe(metadata, b"\0" * len(fs.cat_file(metadata)))  # same size: only a load can tell
    fresh = make_engine(seed=3)
    loaded = Checkpointer(url, keep_last=3, engine=fresh, rank=0, world_size=1).load_latest()
    assert loaded.step == 1 and state_sha256(*fresh.full_state()) == at_one
    names = {k.split("/")[0] for k in objects(s3_env, url)}
    assert "step-000000002" not in names and any(n.startswith("failed-step-000000002-") for n in names)


# --- under torchrun, two ranks: stops, kills and corruption end in the uninterrupted run's state -----------------

STEPS = 12


def run_to_end(procs, tmp, name, args, env):
    p = procs.torchrun([*TINY, *args, "--report", str(tmp / f"{name}.json")], name=name, env=env)
    assert finish(p, timeout=300) == 0, log_of(p)[-4000:]
    return read_json(tmp / f"{name}.json")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    from trainer_testlib import Procs

    tmp = tmp_path_factory.mktemp("baseline")
    procs = Procs(tmp)
    try:
        return run_to_end(procs, tmp, "base", ["--steps", str(STEPS)], {})
    finally:
        procs.cleanup()


def stopped_run(procs, tmp, args, env, at_step):
    """Start a run, SIGTERM it after at_step (its stop save commits), return its report."""
    report = tmp / "first.json"
    env = {**env, "FTJOB_TERMINATION_LOG": str(tmp / "first.term")}
    p = procs.torchrun([*TINY, *args, "--report", str(report)], name="first", env=env)
    wait_for(lambda: report_step(report) >= at_step, timeout=300, proc=p, what=f"step {at_step}")
    os.killpg(p.pid, signal.SIGTERM)
    finish(p)
    first = read_json(report)
    assert first["exit_code"] == 75 and first["preemption_saves"] == 1, log_of(p)[-3000:]
    return first


@pytest.mark.slow
def test_sigterm_then_resume_from_s3(procs, tmp_path, s3, baseline):
    url = s3.bucket() + "/ns/job"
    args = ["--steps", str(STEPS), "--checkpoint-dir", url, "--checkpoint-every", "3", "--async-checkpoint"]
    first = stopped_run(procs, tmp_path, args, s3.env(), at_step=5)
    assert first["last_checkpoint"] == f"{url}/step-{first['step']:09d}"
    second = run_to_end(procs, tmp_path, "second", args, s3.env())
    assert second["resumed_from_step"] == first["step"] and second["step"] == STEPS
    assert second["state_sha256"] == baseline["state_sha256"]


@pytest.mark.slow
def test_sigkill_in_the_middle_of_an_upload_then_resume(procs, tmp_path, s3, baseline):
    url = s3.bucket() + "/ns/job"
    args = ["--steps", str(STEPS), "--checkpoint-dir", url, "--checkpoint-every", "3"]
    # rank 1's first shard of the step-6 save never reaches the server: the upload is frozen half-way
    relay = HoldingRelay(s3.port, b"/step-000000006/__1_")
    try:
        report = tmp_path / "first.json"
        p = procs.torchrun([*TINY, *args, "--report", str(report)], name="first", env=s3.env(relay.endpoint))
        wait_for(relay.held.is_set, timeout=300, proc=p, what="the step-6 upload")
        kill_tree(p.pid)  # SIGKILL, every process of the tree
        finish(p)
    finally:
        relay.close()
    half = {k: v for k, v in objects(s3, url).items() if k.startswith("step-000000006/")}
    assert half and f"step-000000006/{META_FILE}" not in half, f"not half-written: {sorted(half)}"
    assert any(k.startswith("step-000000003/") for k in objects(s3, url))

    second = run_to_end(procs, tmp_path, "second", args, s3.env())
    assert second["resumed_from_step"] == 3, "the half-written step 6 is never loaded"
    assert second["state_sha256"] == baseline["state_sha256"]
    assert "removing incomplete save" in log_of(procs.procs[-1])


@pytest.mark.slow
def test_a_corrupted_newest_checkpoint_falls_back_to_the_previous_one(procs, tmp_path, s3, baseline):
    url = s3.bucket() + "/ns/job"
    args = ["--steps", str(STEPS), "--checkpoint-dir", url, "--checkpoint-every", "3"]
    first = stopped_run(procs, tmp_path, args, s3.env(), at_step=5)
    newest = f"{url}/step-{first['step']:09d}".removeprefix("s3://")
    fs = s3.fs()
    shard = sorted(k for k in objects(s3, "s3://" + newest) if k.endswith(".distcp"))[0]
    size = len(fs.cat_file(f"{newest}/{shard}"))
    fs.pipe(f"{newest}/{shard}", b"\1" * (size // 2))  # cut short: the marker's size no longer matches
    second = run_to_end(procs, tmp_path, "second", args, s3.env())
    assert second["resumed_from_step"] == 3
    assert second["state_sha256"] == baseline["state_sha256"]


@pytest.mark.slow
def test_the_storage_speed_script_measures_disk_memory_and_the_object_store(procs, tmp_path, s3):
    script = Path(__file__).resolve().parents[2] / "bench" / "storage_speed.py"
    p = procs.start(
        [
            sys.executable,
            str(script),
            "--model",
            "tiny",
            "--dir",
            str(tmp_path),
            "--s3-endpoint",
            s3.endpoint,
        ],
        name="speed",
        env=s3.env(),
    )
    assert finish(p, timeout=300) == 0, log_of(p)[-3000:]
    doc = json.loads(log_of(p)[log_of(p).index("{\n") :])
    for where in ("disk", "dev_shm", "s3"):
        assert (
            doc[where]["bytes"] > 1_000_000 and doc[where]["write_MBps"] > 0 and doc[where]["read_MBps"] > 0
        )
