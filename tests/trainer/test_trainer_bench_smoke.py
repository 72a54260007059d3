"""bench/trainer_bench.py runs end to end in --smoke mode on a CPU and reports every figure."""

from __future__ import annotations

import json
import sys

import pytest
from trainer_testlib import REPO, finish, log_of

pytestmark = pytest.mark.slow


def test_bench_smoke_reports_every_figure(procs, tmp_path):
    p = procs.start(
        [
            sys.executable,
            str(REPO / "bench" / "trainer_bench.py"),
            "--out",
            str(tmp_path / "out"),
            "--smoke",
            "--workdir",
            str(tmp_path / "work"),
            "--hf-model",
            "same",
        ],
        name="bench",
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert finish(p, 300) == 0, log_of(p)[-4000:]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    t, c = doc["throughput"], doc["checkpoint"]
    assert t["plain_fsdp2_tokens_per_s"] > 0 and t["engine_tokens_per_s"] > 0
    assert t["engine_over_plain"] == pytest.approx(t["engine_tokens_per_s"] / t["plain_fsdp2_tokens_per_s"])
    # the hf: arm: the preset's sizes as a transformers Llama, timed in the same rounds, the same FLOPs per token
    assert t["hf_tokens_per_s"] > 0 and len(t["rounds"]["hf"]) == len(t["rounds"]["engine"])
    assert t["hf_flops_per_token"] == t["flops_per_token"]
    assert c["state_bytes"] > 1_000_000 and c["disk_write_bytes_per_s"] > 0
    # read from the trainer's events: the SIGTERM save's committed bytes, the load's bytes and read bandwidth
    assert c["sigterm_save_bytes"] >= c["state_bytes"] and c["load_bytes_per_rank"] > 1_000_000
    assert c["load_read_seconds"] > 0 and c["load_read_gbps_per_rank"] > 0
    assert (
        c["sigterm_to_commit_seconds"] > 0
        and c["load_seconds"] > 0
        and len(c["async_save_stall_seconds"]) == 1
    )
    assert set(doc["goals"]) == {
        "engine_over_plain>=0.95",
        "compile_mfu>=0.60",
        "async_save_stall<=1s",
        "sigterm_to_commit_over_ideal<=1.25",
    }
    assert not any((tmp_path / "work").glob("ckpt/step-*"))  # it cleans up its checkpoints
