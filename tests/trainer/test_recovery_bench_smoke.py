"""bench/recovery_gpu.py runs on a CPU with the tiny preset and reports, for each recovery path, every moment of
the breakdown in order (no timing asserts: this proves the script and its reading of the trainer's events)."""

from __future__ import annotations

import json
import sys

import pytest
from ftjob_local.timeline import MOMENTS
from trainer_testlib import REPO, finish, log_of

pytestmark = pytest.mark.slow


def test_recovery_bench_smoke_breaks_down_each_path(procs, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    bench = [sys.executable, str(REPO / "bench" / "recovery_gpu.py")]
    args = [
        "--out",
        str(out),
        "--workdir",
        str(work),
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--probe-mb",
        "16",
        "--pycache-prefix",  # every process's bytecode under its own folder, as in an image built with .pyc
        str(tmp_path / "pyc"),
    ]
    p = procs.start([*bench, *args], name="recovery")
    assert finish(p, 400) == 0, log_of(p)[-4000:]
    doc = json.loads((out / "results.json").read_text())
    # on a CPU the compile path only runs when asked for
    assert list(doc["phases"]) == ["limits", "replacement", "replacement_cold", "survivor", "spare", "notice"]
    assert doc["config"]["launcher"] == "ftjob"  # as worker pods run (python -m ftjob_trainer.launch)
    assert doc["config"]["survivor_signal"] == "SIGUSR2"

    limits = doc["phases"]["limits"]
    medium = limits["checkpoint_medium"]
    assert medium["bytes"] == 16 << 20 and medium["cold_read_parallel_gbps"] > 0, medium
    assert medium["cache_drop"] in ("drop_caches", "fadvise") and medium["cold_read_one_stream_gbps"] > 0
    assert "error" in limits["dev_shm"] or limits["dev_shm"]["read_parallel_gbps"] > 0, limits
    # the forkserver's imports, step by step in fresh interpreters (a replacement's floor)
    tries = limits["imports"]["tries"]
    assert len(tries) == 2 and all(t["torch"] > 0 and t["torch._dynamo"] > 0 for t in tries), tries
    assert all(
        t["interpreter_s"] > sum(v for k, v in t.items() if k in ("torch", "torch._dynamo")) for t in tries
    )
    assert "Imports in a fresh interpreter" in (out / "results.md").read_text()
    # the bytecode was compiled under the prefix before the first phase, and the probe's interpreters read it there
    assert doc["bytecode"]["compile_s"] > 0 and all(t["bytecode_cached"] for t in tries), doc["bytecode"]
    # under the prefix, each .pyc sits at its source's own path
    assert any((tmp_path / "pyc").rglob("torch/_dynamo/__init__.*.pyc"))
    assert "Bytecode: cached under" in (out / "results.md").read_text()

    for path in ("replacement", "replacement_cold", "survivor", "spare", "notice"):
        d = doc["phases"][path]
        assert d["role"] == {"survivor": "survivor"}.get(path, "replacement"), d  # a spare is a new pod
        assert [row["moment"] for row in d["breakdown"]] == list(MOMENTS), d
        since = [row["since_signal_s"] for row in d["breakdown"]]
        assert None not in since and since == sorted(since), d["breakdown"]
        # the survivor hears the peer-stop signal (SIGUSR2): it stops because a peer goes away
        reason = "peer-stopped" if path == "survivor" else "preempted"
        assert d["total_s"] == since[-1] and d["stop_reasons"] == [reason], d
        assert d["stopped_at_step"] == [d["resumed_from_step"]] == [d["stop_save"]["step"]], d
        assert d["load_bytes"] > 0 and d["load_gbps"] > 0 and d["stop_save"]["kind"] == "stop", d
        assert d["load_tiers"] == ["durable"], d  # no --memory-tier here: every save and load is durable
        # what stood between the stopped worker's stop and its exit
        assert set(d["stopped_teardown"]) == {"close_s", "process_group_s"}, d
    # replacement: only the checkpoint's files evicted, and its launcher read ahead; replacement_cold: the whole
    # page cache dropped where it can be (else the checkpoint's files), no read-ahead
    replacement, cold = doc["phases"]["replacement"], doc["phases"]["replacement_cold"]
    assert (replacement["page_cache"], replacement["read_ahead"]) == ("fadvise", True), replacement
    assert replacement["launcher"]["read_ahead_done_s"] is not None, replacement["launcher"]
    assert cold["page_cache"] in ("drop_caches", "fadvise") and cold["read_ahead"] is False, cold
    assert cold["launcher"]["read_ahead_done_s"] is None, cold["launcher"]
    for path in ("spare", "notice"):
        d = doc["phases"][path]
        # the replacement waited in the rendezvous; it read the checkpoint after its page cache was dropped
        assert d["page_cache"] in ("drop_caches", "fadvise"), d
        assert d["cache_dropped_before_load"] is True, d
    # the spare's launcher started before the signal; the notice path's with it, before the preempted one exited
    assert doc["phases"]["spare"]["launched_s"] is None
    notice = doc["phases"]["notice"]
    exited = next(r["since_signal_s"] for r in notice["breakdown"] if r["moment"] == "exited")
    # launched_s counts from the trainer receiving the signal, which torchrun forwards: the bench sends the signal,
    # then launches, and the launch can come a few ms before the worker hears it (CI saw -0.001)
    assert notice["launched_s"] < exited, notice
    # its launcher's start-up, in order: the agent's imports, then its round (after the preempted agent left it)
    up = notice["launcher"]
    assert notice["launched_s"] < up["agent_imported_s"] < up["round_formed_s"], up
    assert notice["launched_s"] < up["forkserver_imported_s"], up
    assert up["preempted_left_s"] is not None and up["preempted_left_s"] < up["round_formed_s"], up
    spare = doc["phases"]["spare"]["launcher"]
    assert spare["agent_imported_s"] < 0 and spare["forkserver_imported_s"] < 0, spare  # a spare is warm
    assert set(doc["goals"]) == {
        "survivor: signal -> first step <= 12 s",
        "replacement: signal -> first step <= 20 s",
        "replacement_cold: signal -> first step <= 20 s",
        "spare: signal -> first step <= 20 s",
        "notice: signal -> first step <= 20 s",
        "compile: signal -> first step <= 30 s",
        "spare_compile: signal -> first step <= 30 s",
        "notice_compile: signal -> first step <= 30 s",
        "replacement_cold: load >= 0.8 x the medium's parallel cold read",
        "survivor: load from the memory tier >= 8 GB/s",
    }
    assert all(g["met"] is None for g in doc["goals"].values())  # the goals are the H200's with the 1b preset
    md = (out / "results.md").read_text()
    paths = ("replacement", "replacement_cold", "survivor", "spare", "notice")
    assert all(f"| {path} | 0.00 |" in md for path in paths), md
    assert (out / "replacement" / "replacement.log").exists() and (out / "survivor" / "survivor.log").exists()
    assert not any(work.rglob("*.distcp")), "the checkpoints of each phase are removed after it"
