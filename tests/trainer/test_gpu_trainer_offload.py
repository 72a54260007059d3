"""GPU only: the whole trainer under torchrun with --cpu-offload / --param-offload: periodic saves, a SIGTERM
save, and a resume that finishes."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from trainer_testlib import TINY, finish, log_of, read_json, report_step, wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("flag", ["--cpu-offload", "--param-offload"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_offload_modes_save_on_sigterm_and_resume(procs, tmp_path, flag, mode):
    ckpt, report = tmp_path / "ckpt", tmp_path / "r.json"
    args = [*TINY, flag, "--steps", "200", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3"]
    args += ["--async-checkpoint"] if mode == "async" else []
    env = {"FTJOB_TERMINATION_LOG": str(tmp_path / "term")}
    p = procs.torchrun([*args, "--report", str(report)], name="first", nproc=1, env=env)
    wait_for(lambda: report_step(report) >= 7, timeout=300, proc=p, what="step 7")
    os.kill(p.pid, signal.SIGTERM)
    finish(p)
    term = read_json(tmp_path / "term")
    assert term["exitCode"] == 75 and term["reason"] == "preempted", log_of(p)[-4000:]
    assert "storage" not in log_of(p)
    p = procs.torchrun(
        [*args, "--report", str(report), "--steps", str(term["step"] + 5)], name="second", nproc=1, env=env
    )
    assert finish(p, 300) == 0, log_of(p)[-4000:]
    doc = read_json(report)
    assert doc["resumed_from_step"] == term["step"] and doc["step"] == term["step"] + 5
