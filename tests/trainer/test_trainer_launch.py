"""ftjob_trainer.launch: torchrun's agent with warm workers (forked from a process that imported torch and the
trainer), an agent that leaves its rendezvous when it is stopped, and faster polling while a round forms."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import sys
from types import SimpleNamespace

import pytest
from ftjob_trainer import launch, peer_restart, torchrun_args, warm_worker
from trainer_testlib import (
    TINY,
    events_of,
    finish,
    list_steps,
    log_of,
    read_json,
    report_step,
    start_coordinator,
    wait_for,
)

# A program that says what it found when it started: torch already imported means it was forked warm.
# The first time, every rank waits until all have reported (a rank that exits first makes torchrun stop the rest),
# then exits PROBE_EXIT.
PROBE = """
import json, os, pathlib, sys, time
warm = "torch" in sys.modules
restart, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
here = pathlib.Path(os.environ["PROBE_DIR"])
said = here / f".said-{restart}-{rank}"
said.write_text(json.dumps({"probe": rank, "warm": warm, "argv": sys.argv[1:], "restart": restart, "main": __name__,
                            "time": time.time()}))
said.rename(here / f"seen-{restart}-{rank}")  # whole once seen: a rank that exits first gets the others stopped
if restart == "0":
    while len(list(here.glob("seen-0-*"))) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.05)
    sys.exit(int(os.environ["PROBE_EXIT"]))
"""


def probes(here) -> list[dict]:
    """What each probe said, from its own file (two ranks' prints to the shared log could interleave on a line)."""
    return [json.loads(f.read_text()) for f in sorted(here.glob("seen-*"))]


# ================================================================================================ pure parts
def test_the_forkserver_preloads_the_trainer_only_when_it_is_the_program():
    builtin = launch.preload_modules(["--nnodes=1:2", "-m", "ftjob_trainer.train", "--steps", "5"])
    custom = launch.preload_modules(["--nnodes=1:2", "/app/train.py", "-m", "ftjob_trainer.train"])
    common = [launch.FORKSERVER_FIRST, launch.WORKER_ENTRY, "torch", "torch.distributed"]
    trainer = ["torch._dynamo", "ftjob_trainer.train", "ftjob_trainer.models"]
    assert builtin == [*common, *trainer, launch.FORKSERVER_LAST]  # the last one says the imports are done
    # a script's own "-m x" argument is still a pair: it warms the trainer too, harmlessly; no -m at all does not
    assert launch.preload_modules(["--standalone", "/app/train.py", "--lr", "1"]) == [
        *common,
        launch.FORKSERVER_LAST,
    ]
    assert custom[: len(common)] == common


def test_switches_are_on_unless_turned_off():
    assert launch.enabled("X", {}) and launch.enabled("X", {"X": "1"}) and launch.enabled("X", {"X": "yes"})
    assert not any(launch.enabled("X", {"X": v}) for v in ("0", "false", "No", " off "))


def test_the_exit_barrier_is_30s_unless_set_and_reaches_the_agent_torchrun_builds(monkeypatch):
    from torch.distributed.launcher import api

    assert launch.exit_barrier_seconds({}) == launch.EXIT_BARRIER_SECONDS == 30.0
    assert launch.exit_barrier_seconds({launch.ENV_EXIT_BARRIER_SECONDS: " 2.5 "}) == 2.5
    monkeypatch.setattr(api, "LocalElasticAgent", api.LocalElasticAgent)  # restored after the test
    assert launch.shorter_exit_barrier(4.0)
    spec = SimpleNamespace(role="trainer", max_restarts=0, rdzv_handler=None, local_world_size=1)
    agent = api.LocalElasticAgent(spec=spec, logs_specs=None)
    assert agent._exit_barrier_timeout == 4.0


def test_poll_interval_grows_with_the_nodes_up_to_c10ds_own():
    assert launch.poll_seconds(2, {}) == launch.MIN_POLL_SECONDS
    assert launch.poll_seconds(50, {}) == pytest.approx(0.5)
    assert launch.poll_seconds(5000, {}) == launch.C10D_POLL_SECONDS
    assert launch.poll_seconds(2, {launch.ENV_POLL_SECONDS: "0.25"}) == 0.25


def test_python_programs_become_warm_workers_and_others_stay_torchruns():
    pytest.importorskip("torch")

    def config_from_args(args):
        return SimpleNamespace(start_method="spawn"), *args

    config = launch.warm_config(config_from_args)
    cfg, entry, args = config(("/venv/bin/python", ["-u", "-m", "ftjob_trainer.train", "--steps", "3"]))
    assert (cfg.start_method, entry, args) == (
        "forkserver",
        warm_worker.run,
        ["-m", "ftjob_trainer.train", "--steps", "3"],
    )
    cfg, entry, args = config(("/app/trainer-binary", ["--steps", "3"]))  # --no-python: not ours to fork
    assert (cfg.start_method, entry, args) == ("spawn", "/app/trainer-binary", ["--steps", "3"])


def test_an_older_torchrun_gets_no_shutdown_flag_and_its_agent_closes_workers_within_it(monkeypatch):
    import argparse

    from torch.distributed.elastic.multiprocessing import api as processes

    argv = [
        "--nnodes=1:2",
        "--shutdown-timeout=27",
        "--local-addr=x",
        "-m",
        "ftjob_trainer.train",
        "--shutdown-timeout=5",
    ]
    # torchrun's own flag goes; the program's argument of the same name stays
    assert torchrun_args.without_shutdown_flag(argv) == (
        ["--nnodes=1:2", "--local-addr=x", "-m", "ftjob_trainer.train", "--shutdown-timeout=5"],
        27,
    )
    assert (
        torchrun_args.without_shutdown_flag(["--standalone", "/app/x.py", "--shutdown-timeout=3"])[1] is None
    )
    old = argparse.ArgumentParser()
    old.add_argument("--max-restarts")
    assert not torchrun_args.knows_flag(old, "--shutdown-timeout") and torchrun_args.knows_flag(
        old, "--max-restarts"
    )

    seen = []
    monkeypatch.setattr(
        processes.PContext, "close", lambda self, death_sig=None, timeout=30: seen.append(timeout)
    )
    assert launch.close_workers_within(27)
    processes.PContext.close(object())  # as the agent calls it: no timeout given
    processes.PContext.close(object(), None, 5)  # a timeout given stays
    assert seen == [27, 5]


def test_a_worker_exit_is_logged_without_the_agents_traceback_and_other_errors_keep_theirs():
    import torch.multiprocessing as mp

    quiet = launch.WorkerExitWithoutTraceback()

    def record(error: BaseException) -> logging.LogRecord:
        return logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", None, (type(error), error, None))

    exited = record(mp.ProcessExitedException("process 0 terminated with exit code 75", 0, 75, 123, 75))
    raised = record(RuntimeError("boom"))
    assert quiet.filter(exited) and exited.exc_info is None and exited.getMessage() == "failed"
    assert quiet.filter(raised) and raised.exc_info is not None


def test_warm_worker_runs_a_module_or_a_script_as_main_with_its_arguments(tmp_path, monkeypatch, capsys):
    (tmp_path / "probe_mod.py").write_text("import sys\nprint(__name__, sys.argv[1:])\nsys.exit(75)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    with pytest.raises(SystemExit) as ended:
        warm_worker.run("-m", "probe_mod", "--steps", "3")
    assert ended.value.code == 75 and capsys.readouterr().out == "__main__ ['--steps', '3']\n"
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    (script.parent / "helper.py").write_text("VALUE = 7\n")
    script.write_text("import sys, helper\nprint(__name__, helper.VALUE, sys.argv)\n")  # a sibling import
    warm_worker.run(str(script), "--lr", "1")
    assert capsys.readouterr().out == f"__main__ 7 [{str(script)!r}, '--lr', '1']\n"


# ================================================================================================ processes
@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False])
def test_workers_start_with_torch_imported_and_exit_codes_restart_them(procs, tmp_path, warm):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    p = procs.launch(
        ["--flag", "x"],
        name="probe",
        nproc=2,
        max_restarts=1,
        program=[str(probe)],
        env={"PROBE_EXIT": "75", "PROBE_DIR": str(tmp_path), launch.ENV_WARM_WORKERS: "1" if warm else "0"},
    )
    assert finish(p) == 0, log_of(p)[-3000:]
    seen = sorted((d["restart"], d["probe"], d["warm"], d["main"]) for d in probes(tmp_path))
    # exit 75 restarted both ranks once, as torchrun restarts them; every worker found torch imported iff warm
    assert seen == [(r, rank, warm, "__main__") for r in "01" for rank in "01"], log_of(p)[-3000:]
    assert all(d["argv"] == ["--flag", "x"] for d in probes(tmp_path))
    # the launcher's start-up as events: its agent's imports, its forkserver's (warm only), one round per start
    evs = events_of(p)
    names = [e["event"] for e in evs]
    (ready,) = [e for e in evs if e["event"] == "launcher_ready"]
    assert ready["warm"] is warm and ready["rank"] is None and ready["since_start_s"] > 0, ready
    assert names.count("warm_imports_done") == int(warm) and names.count("round_formed") == 2, names
    # the agent imports, then joins; a worker starts after its round formed, a warm one after the forkserver's imports
    first_round = min(e["time"] for e in evs if e["event"] == "round_formed")
    first_worker = min(d["time"] for d in probes(tmp_path))
    assert ready["time"] < first_round < first_worker, (ready, first_round, first_worker)
    assert all(e["time"] < first_worker for e in evs if e["event"] == "warm_imports_done"), evs


@pytest.mark.slow
def test_sigterm_to_the_pods_processes_saves_before_the_agent_exits(procs, tmp_path):
    """The local kubelet signals the container's process group: the forkserver lives in a session of its own, so
    its workers save and exit 75 before the agent ends (it waits for them, as torchrun waits for its own)."""
    ckpt, report = tmp_path / "ckpt", tmp_path / "r.json"
    p = procs.launch(
        [*TINY, "--steps", "400", "--checkpoint-dir", str(ckpt), "--report", str(report)],
        name="run",
        env={"FTJOB_TERMINATION_LOG": str(tmp_path / "term")},
    )
    wait_for(lambda: report_step(report) >= 3, timeout=180, proc=p, what="training (step 3)")
    os.killpg(p.pid, signal.SIGTERM)
    assert finish(p) != 0  # an agent stopped by a signal fails, as torchrun's does
    exits = [(e["rank"], e["code"], e["reason"]) for e in events_of(p) if e["event"] == "exit"]
    assert sorted(exits) == [(0, 75, "preempted"), (1, 75, "preempted")], log_of(p)[-3000:]
    term = read_json(tmp_path / "term")
    assert term["exitCode"] == 75 and list_steps(ckpt)[-1] == term["step"]
    started = [e for e in events_of(p) if e["event"] == "process_started"]
    assert len(started) == 2 and all(e["rank"] in (0, 1) for e in started)  # RANK, read after the fork


def _rendezvous_pids(store_port: int, run_id: str) -> tuple[set[int], set[int]]:
    """The agents (by pid) c10d's shared state holds as participants, and those with a heartbeat."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    store = TCPStore("127.0.0.1", store_port, is_master=False, wait_for_workers=False)
    state = pickle.loads(C10dRendezvousBackend(store, run_id).get_state()[0])
    return {n.pid for n in state.participants}, {n.pid for n in state.last_heartbeats}


def _long_keepalive_rdzv(store_port: int, run_id: str) -> list[str]:
    """Up to two agents through the coordinator's store, with a keep-alive that would hold a silent agent for 10
    minutes: only an agent that leaves lets the next round form sooner."""
    return [
        "--nnodes=1:2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{store_port}",
        f"--rdzv-id={run_id}",
        "--rdzv-conf=is_host=0,last_call_timeout=1,keep_alive_interval=60,keep_alive_max_attempt=10,join_timeout=600",
    ]


def test_the_agents_own_restarts_use_the_trainers_first_peer_stop_signal():
    assert peer_restart.peer_stop_signal(["--steps", "5"]) == signal.SIGUSR2  # the trainer's default
    assert peer_restart.peer_stop_signal(["--peer-stop-signals", "sighup,SIGUSR2"]) == signal.SIGHUP
    assert (
        peer_restart.peer_stop_signal(["--stop-signals=SIGTERM", "--peer-stop-signals=SIGUSR1"])
        == signal.SIGUSR1
    )
    assert peer_restart.peer_stop_signal([], {"FTJOB_PEER_STOP_SIGNALS": "SIGHUP"}) == signal.SIGHUP
    # none, or a name the trainer itself refuses: torchrun's SIGTERM stays
    assert peer_restart.peer_stop_signal(["--peer-stop-signals="]) is None
    assert peer_restart.peer_stop_signal(["--peer-stop-signals", "SIGNOPE"]) is None


@pytest.mark.slow
@pytest.mark.parametrize("leave", [True, False])
def test_a_stopped_agent_leaves_the_rendezvous_and_the_survivor_goes_on_without_its_keepalive(
    procs, tmp_path, leave
):
    """Two agents through the coordinator's store, with a keep-alive that would hold a silent agent for 10
    minutes. SIGTERM to one agent: it saves with its peer, leaves the round, and the survivor forms the next round
    alone and trains on; without leaving, the round still holds it."""
    _, ports = start_coordinator(procs, "t0ken")
    ckpt = tmp_path / "ckpt"
    run_id = f"job-leave-{leave}"
    rdzv = _long_keepalive_rdzv(ports["storePort"], run_id)
    agents = {}
    for name in ("a", "b"):
        env = {
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "FTJOB_TERMINATION_LOG": str(tmp_path / f"{name}.term"),
            launch.ENV_LEAVE_RENDEZVOUS: "1" if leave else "0",
        }
        args = [
            *TINY,
            "--steps",
            "400",
            "--checkpoint-dir",
            str(ckpt),
            "--report",
            str(tmp_path / f"{name}.json"),
        ]
        agents[name] = procs.launch(args, name=name, nproc=1, env=env, rdzv=rdzv, max_restarts=3)

    def rank0_report():
        return next((n for n in agents if report_step(tmp_path / f"{n}.json") >= 3), None)

    wait_for(rank0_report, timeout=240, proc=agents["a"], what="both agents training (step 3)")
    assert _rendezvous_pids(ports["storePort"], run_id)[0] == {agents["a"].pid, agents["b"].pid}
    os.killpg(agents["a"].pid, signal.SIGTERM)
    assert finish(agents["a"]) != 0
    saved = read_json(tmp_path / "a.term")["step"]
    participants, alive = _rendezvous_pids(ports["storePort"], run_id)
    if not leave:
        # torchrun's own way: the stopped agent stays a participant until its keep-alive expires
        assert agents["a"].pid in participants | alive
        return
    assert agents["a"].pid not in participants | alive, log_of(agents["a"])[-2000:]
    # once: when its worker's stop save was durable, or at its exit if the worker exited first (a tiny model's
    # teardown can be quicker than the launcher's look for the worker's word)
    left = [e["why"] for e in events_of(agents["a"]) if e["event"] == "rendezvous_left"]
    assert left in (["stop-committed"], ["SIGTERM"]), left

    def resumed_alone():
        doc = read_json(tmp_path / "b.json") or {}
        return doc if doc.get("world_size") == 1 and doc.get("step", 0) > saved else None

    # within the keep-alive's 10 minutes only a departed agent lets the survivor's round form
    wait_for(resumed_alone, timeout=300, proc=agents["b"], what="the survivor training alone after the save")


@pytest.mark.slow
def test_a_node_joining_a_running_round_stops_its_workers_as_survivors_not_as_preempted(procs, tmp_path):
    """A round of one trains; a second agent joins (a replacement that came after the survivor's round formed).
    The first agent restarts its worker into a round of two with the peer-stop signal: the worker saves as a
    survivor (exit 75, "peer-stopped") and never says it was preempted, and its agent stays in the rendezvous. With
    SIGTERM the worker took its pod for preempted, the agent left the rendezvous it was restarting into and crashed
    (c10d's KeyError), closing the round for the new node: the operator counted a preemption and a failure."""
    _, ports = start_coordinator(procs, "t0ken")
    run_id = "job-scale-up"
    rdzv = _long_keepalive_rdzv(ports["storePort"], run_id)
    agents = {}

    def start(name: str):
        env = {
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "FTJOB_TERMINATION_LOG": str(tmp_path / f"{name}.term"),
        }
        report = ["--report", str(tmp_path / "report.json")]
        args = [*TINY, "--steps", "100000", "--checkpoint-dir", str(tmp_path / "ckpt"), *report]
        agents[name] = procs.launch(args, name=name, nproc=1, env=env, rdzv=rdzv, max_restarts=3)

    start("a")
    wait_for(
        lambda: report_step(tmp_path / "report.json") >= 3, timeout=240, proc=agents["a"], what="a alone"
    )
    start("b")

    def both_training():
        doc = read_json(tmp_path / "report.json") or {}
        stopped = [e for e in events_of(agents["a"]) if e["event"] == "exit"]
        return stopped and doc.get("world_size") == 2 and doc.get("step", 0) > stopped[0]["step"] and stopped

    stopped = wait_for(
        both_training, timeout=240, proc=agents["a"], what="a and b training as a round of two"
    )
    assert [(e["code"], e["reason"]) for e in stopped] == [(75, "peer-stopped")], stopped
    assert not [e for e in events_of(agents["a"]) if e["event"] == "rendezvous_left"], log_of(agents["a"])[
        -3000:
    ]
    assert agents["a"].poll() is None and agents["b"].poll() is None
    assert "Traceback" not in log_of(agents["a"]), log_of(agents["a"])[-3000:]


def _waiting_pids(store_port: int, run_id: str) -> set[int]:
    """The agents (by pid) c10d's shared state holds as waiting: its wait list and redundancy list (spares)."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    store = TCPStore("127.0.0.1", store_port, is_master=False, wait_for_workers=False)
    got = C10dRendezvousBackend(store, run_id).get_state()
    state = pickle.loads(got[0]) if got else None
    return {n.pid for n in state.wait_list | getattr(state, "redundancy_list", set())} if state else set()


# A job's worker that runs until the test releases it, then ends the job with exit 0: the job cannot end before
# the test has what it needs (a tiny trainer's 40 steps sometimes ended before a spare had joined).
RUN_UNTIL_RELEASED = """
import os, pathlib, sys, time
pathlib.Path(os.environ["READY"]).touch()
while not pathlib.Path(os.environ["RELEASE"]).exists():
    time.sleep(0.05)
sys.exit(0)
"""


@pytest.mark.slow
def test_a_spare_left_out_when_the_job_ends_neither_fails_nor_succeeds_it(procs, tmp_path):
    """One node's job with a warm spare waiting in the rendezvous. The job ends (exit 0) and closes the
    rendezvous: torchrun's own agent would exit 1 there, a failure the operator read before the finished pod's 0
    and restarted a job that had succeeded. The spare says why and waits until a signal ends it."""
    _, ports = start_coordinator(procs, "t0ken")
    run_id = "job-spare-left-out"
    rdzv = [
        "--nnodes=1:1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{ports['storePort']}",
        f"--rdzv-id={run_id}",
        "--rdzv-conf=is_host=0,last_call_timeout=1,join_timeout=600",
    ]
    script, ready, release = tmp_path / "worker.py", tmp_path / "ready", tmp_path / "release"
    script.write_text(RUN_UNTIL_RELEASED)
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "READY": str(ready), "RELEASE": str(release)}
    a = procs.launch([], name="a", nproc=1, env=env, rdzv=rdzv, program=[str(script)])
    wait_for(ready.exists, timeout=120, proc=a, what="the job's worker running")
    spare = procs.launch([], name="spare", nproc=1, env=env, rdzv=rdzv, program=[str(script)])
    wait_for(
        lambda: spare.pid in _waiting_pids(ports["storePort"], run_id),
        timeout=120,
        proc=spare,
        what="the spare waiting in the rendezvous",
    )
    release.touch()  # the job ends while the spare waits
    assert finish(a) == 0, log_of(a)[-3000:]
    closed = lambda: [e for e in events_of(spare) if e["event"] == "rendezvous_closed"]  # noqa: E731
    wait_for(closed, timeout=60, proc=spare, what="the spare learning that the rendezvous closed")
    assert spare.poll() is None, log_of(spare)[-3000:]  # still there: no exit code speaks for the job
    assert not [e for e in events_of(spare) if e["event"] == "process_started"]  # it never ran a worker
    os.kill(spare.pid, signal.SIGTERM)
    assert finish(spare) == -signal.SIGTERM
    assert "Traceback" not in log_of(spare), log_of(spare)[-3000:]


# A worker that stops like a preempted trainer: on SIGTERM it says its stop checkpoint is committed (the file the
# launcher named), then holds until released, as a trainer's teardown would, and exits 75.
COMMIT_THEN_HOLD = """
import os, pathlib, signal, sys, time
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
pathlib.Path(os.environ["READY"]).touch()
while not stopped:
    time.sleep(0.05)
if os.environ["SAY_COMMITTED"] == "1":
    pathlib.Path(os.environ["FTJOB_STOP_COMMITTED_FILE"]).touch()
pathlib.Path(os.environ["STOPPED"]).touch()
while not pathlib.Path(os.environ["RELEASE"]).exists():
    time.sleep(0.05)
sys.exit(75)
"""


@pytest.mark.slow
@pytest.mark.parametrize("committed", [True, False])
def test_a_preempted_agent_leaves_once_its_worker_committed_not_when_the_worker_exits(
    procs, tmp_path, committed
):
    """A new pod or a warm spare waits for the preempted agent to leave the round; the worker's teardown after its
    stop commit (2-3 s at the 1b preset) must not add to that wait. Without the commit's word the agent stays until
    its worker exits (a save still writing, or refused)."""
    _, ports = start_coordinator(procs, "t0ken")
    run_id = f"job-commit-{committed}"
    rdzv = _long_keepalive_rdzv(ports["storePort"], run_id)
    script, ready, release = tmp_path / "worker.py", tmp_path / "ready", tmp_path / "release"
    stopped = tmp_path / "stopped"
    script.write_text(COMMIT_THEN_HOLD)
    env = {
        "READY": str(ready),
        "STOPPED": str(stopped),
        "RELEASE": str(release),
        "SAY_COMMITTED": "1" if committed else "0",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    agent = procs.launch([], name="agent", nproc=1, rdzv=rdzv, program=[str(script)], env=env)
    wait_for(ready.exists, timeout=120, proc=agent, what="the worker running")
    assert agent.pid in _rendezvous_pids(ports["storePort"], run_id)[0]
    os.killpg(agent.pid, signal.SIGTERM)  # what the kubelet does to a preempted pod
    wait_for(stopped.exists, timeout=60, proc=agent, what="the worker told of the stop")
    if committed:
        wait_for(
            lambda: agent.pid not in set().union(*_rendezvous_pids(ports["storePort"], run_id)),
            timeout=60,
            proc=agent,
            what="the agent gone from the rendezvous while its worker still holds",
        )
        assert (
            agent.poll() is None
        )  # the worker has not exited (it holds until released): the agent waits for it
    else:  # the worker holds until released: nothing has left yet
        assert agent.pid in _rendezvous_pids(ports["storePort"], run_id)[0]
        assert not [e for e in events_of(agent) if e["event"] == "rendezvous_left"]
    release.touch()
    assert finish(agent) != 0  # an agent stopped by a signal fails, as torchrun's does
    left = [e["why"] for e in events_of(agent) if e["event"] == "rendezvous_left"]
    assert left == (["stop-committed"] if committed else ["SIGTERM"]), log_of(agent)[-3000:]
    assert agent.pid not in set().union(*_rendezvous_pids(ports["storePort"], run_id))


@pytest.mark.slow
@pytest.mark.parametrize("preempted", [True, False], ids=["preempted", "peer-goes-away"])
def test_a_preempted_worker_says_its_stop_commit_and_a_survivor_does_not(procs, tmp_path, preempted):
    """The trainer's side of the above, under plain torchrun: a preempted pod's workers create the launcher's file
    once their stop save is committed on the durable tier; workers stopped because a peer goes away (their save
    only in memory, their agent restarts them in the same round) never do."""
    said = tmp_path / "stop-committed"
    args = [
        *TINY,
        "--steps",
        "12",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--report",
        str(tmp_path / "r.json"),
    ]
    args += ["--memory-checkpoint-dir", str(tmp_path / "shm")]
    env = {"FTJOB_STOP_COMMITTED_FILE": str(said), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    p = procs.torchrun(args, name="run", max_restarts=0 if preempted else 1, env=env)
    wait_for(lambda: report_step(tmp_path / "r.json") >= 3, timeout=180, proc=p, what="training (step 3)")
    if preempted:
        os.killpg(p.pid, signal.SIGTERM)  # the pod's processes, as the kubelet signals them
        assert finish(p) != 0
    else:
        (worker,) = [e for e in events_of(p) if e["event"] == "process_started" and e["rank"] == 1]
        os.kill(worker["pid"], signal.SIGUSR2)  # the trainer's peer-stop signal
        assert finish(p) == 0, log_of(p)[-3000:]
    evs = events_of(p)
    stops = [e for e in evs if e["event"] == "checkpoint_committed" and e["kind"] == "stop"]
    assert stops and stops[0]["tier"] == ("durable" if preempted else "memory"), stops
    assert said.exists() == preempted


HOLD = """
import os, pathlib, time
while os.environ["HOLD"] == "1" and not pathlib.Path(os.environ["RELEASE"]).exists():
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_an_agent_whose_workers_finished_waits_for_a_peer_that_never_finishes_only_briefly(procs, tmp_path):
    """A job that finishes while a peer is preempted: the finished agent's exit barrier waits for an agent that
    never arrives. torchrun's 300 s kept the finished pod running; the launcher's barrier ends it within seconds."""
    _, ports = start_coordinator(procs, "t0ken")
    rdzv = [
        "--nnodes=2:2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{ports['storePort']}",
        "--rdzv-id=job-barrier",
        "--rdzv-conf=is_host=0,last_call_timeout=1,join_timeout=120",
    ]
    script, release = tmp_path / "hold.py", tmp_path / "release"
    script.write_text(HOLD)
    agents = {
        name: procs.launch(
            [],
            name=name,
            nproc=1,
            rdzv=rdzv,
            program=[str(script)],
            env={
                "HOLD": hold,
                "RELEASE": str(release),
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                launch.ENV_EXIT_BARRIER_SECONDS: "2",
            },
        )
        for name, hold in (("done", "0"), ("held", "1"))
    }
    # well below torchrun's own 300 s, which this would wait without the launcher
    assert finish(agents["done"], timeout=150) == 0, log_of(agents["done"])[-3000:]
    assert agents["held"].poll() is None  # its worker still runs: the barrier gave up on it
    release.touch()
    assert finish(agents["held"]) == 0, log_of(agents["held"])[-3000:]
