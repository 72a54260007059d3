"""ftjob_trainer.launch: torchrun's agent with warm workers (forked from a process that imported torch and the
trainer), an agent that leaves its rendezvous when it is stopped, and faster polling while a round forms."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
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
    assert finish(p) == 1  # an agent stopped by a signal fails, as torchrun's does, saying why
    assert "SignalException: Process" in log_of(p)
    exits = [(e["rank"], e["code"], e["reason"]) for e in events_of(p) if e["event"] == "exit"]
    assert sorted(exits) == [(0, 75, "preempted"), (1, 75, "preempted")], log_of(p)[-3000:]
    term = read_json(tmp_path / "term")
    assert term["exitCode"] == 75 and list_steps(ckpt)[-1] == term["step"]
    started = [e for e in events_of(p) if e["event"] == "process_started"]
    assert len(started) == 2 and all(e["rank"] in (0, 1) for e in started)  # RANK, read after the fork


FINALIZED = """
import atexit, pathlib, sys
from ftjob_trainer import launch
here = pathlib.Path(sys.argv[1])
atexit.register(lambda: (here / "atexit").write_text("ran"))
class Finalized:  # a module global's finaliser runs only in the interpreter's own teardown
    def __del__(self):
        (here / "finalized").write_text("ran")
KEEP = Finalized()
try:
    raise RuntimeError("stopped by a signal")
except RuntimeError as e:
    launch.exit_stopped(e)
"""


def test_a_stopped_agent_exits_1_with_its_traceback_and_atexit_but_without_the_teardown(tmp_path):
    """What an uncaught exception does, less the interpreter's finalization (0.7 s with torch loaded)."""
    script = tmp_path / "stopped.py"
    script.write_text(FINALIZED)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: stopped by a signal" in done.stderr and "Traceback" in done.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "finalized").exists()
    # the same script ending normally runs the finaliser: the check above can fail
    script.write_text(FINALIZED.replace("launch.exit_stopped(e)", "pass"))
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, timeout=120)
    assert (tmp_path / "finalized").read_text() == "ran"


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
