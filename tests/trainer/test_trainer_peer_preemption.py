"""A peer's preemption: two torchrun agents (one worker each) of one job, rendezvous through the coordinator's
store (as the operator runs them). SIGTERM to one agent: both ranks save the same step, the preempted one
exits, the survivor exits 75, its agent restarts it into a new round alone, and it resumes and finishes."""

from __future__ import annotations

import os
import signal

import pytest
from ftjob_trainer.contract import parse_time
from trainer_testlib import (
    TINY,
    events_of,
    finish,
    http,
    log_of,
    read_json,
    report_step,
    start_coordinator,
    wait_for,
)

pytestmark = pytest.mark.slow
TOKEN = "t0ken"
STEPS = 60


def test_sigterm_to_one_agent_both_save_same_step_survivor_restarts(procs, tmp_path):
    _, ports = start_coordinator(procs, TOKEN)
    ckpt = tmp_path / "ckpt"
    rdzv = [
        "--nnodes=1:2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{ports['storePort']}",
        "--rdzv-id=job-peer",
        # is_host=0: the store is the coordinator's, not an agent's; short keep-alive: a dead agent is noticed fast
        "--rdzv-conf=is_host=0,last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2,join_timeout=120",
        "--monitor-interval=0.2",
    ]
    agents = {}
    for name in ("a", "b"):
        args = [
            *TINY,
            "--steps",
            str(STEPS),
            "--checkpoint-dir",
            str(ckpt),
            "--report",
            str(tmp_path / f"{name}.json"),
        ]
        env = {
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "FTJOB_TERMINATION_LOG": str(tmp_path / f"{name}.term"),
            "FTJOB_COORDINATOR_URL": f"http://127.0.0.1:{ports['controlPort']}",
            "FTJOB_TOKEN": TOKEN,
        }
        agents[name] = procs.torchrun(args, name=name, nproc=1, env=env, rdzv=rdzv, max_restarts=3)

    def rank0_report():
        return next((n for n in agents if report_step(tmp_path / f"{n}.json") >= 5), None)

    wait_for(rank0_report, timeout=180, proc=agents["a"], what="both agents training (step 5)")
    assert read_json(tmp_path / f"{rank0_report()}.json")["world_size"] == 2
    os.kill(agents["a"].pid, signal.SIGTERM)  # the agent only: it forwards SIGTERM to its worker, as in a pod

    term_a = wait_for(lambda: read_json(tmp_path / "a.term"), timeout=60, what="a's termination message")
    assert term_a["exitCode"] == 75 and term_a["reason"] == "preempted"
    saved = term_a["step"]
    assert term_a["checkpoint"] == str(ckpt / f"step-{saved:09d}")
    assert finish(agents["a"]) != 0  # the preempted agent goes away with its pod

    # the survivor saved the same step with its peer, exited 75 and was restarted by its agent
    assert finish(agents["b"], timeout=240) == 0, log_of(agents["b"])[-4000:]
    b = events_of(agents["b"])
    # two processes in b's pod: the one that stopped with its peer, and the one torchrun restarted in its place
    starts = [e["restart_count"] for e in b if e["event"] == "process_started"]
    exits = [(e["code"], e["reason"], e["step"]) for e in b if e["event"] == "exit"]
    assert starts == [0, 1] and exits == [(75, "peer-stopped", saved), (0, "done", STEPS)], exits
    (agreed,) = [e for e in b if e["event"] == "stop_agreed"]
    assert (agreed["step"], agreed["reason"], agreed["since_signal_s"]) == (saved, "peer-stopped", None)
    assert not [e for e in b if e["event"] == "stop_signal"]  # b was never signalled
    (loaded,) = [e for e in b if e["event"] == "checkpoint_loaded"]
    assert loaded["step"] == saved and loaded["saved_world_size"] == 2
    final = read_json(tmp_path / "b.json")
    assert (
        final["world_size"] == 1 and final["resumed_from_step"] == saved and final["first_step"] == saved + 1
    )
    assert final["step"] == STEPS and final["exit_code"] == 0 and final["preemption_saves"] == 1
    assert read_json(tmp_path / "b.term")["reason"] == "done"
    _, progress = http("GET", f"http://127.0.0.1:{ports['controlPort']}/v1/progress", TOKEN)
    assert progress["step"] == STEPS and progress["worldSize"] == 1
    # The survivor's run says where it resumed and when that step was trained (before the stop was agreed).
    run = progress["run"]
    assert run["resumedFromStep"] == saved
    trained, first = (parse_time(run[k]).timestamp() for k in ("resumedStepTime", "firstStepTime"))
    assert trained <= agreed["time"] < first
