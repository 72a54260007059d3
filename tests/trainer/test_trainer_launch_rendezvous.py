"""ftjob_trainer.launch and torchrun's c10d rendezvous: an agent that is stopped leaves its round (the survivor
goes on without waiting out its keep-alive), a preempted agent leaves once its worker committed, a joining node
stops the running workers as survivors, and a spare left out or a finished agent does not hold the job."""

from __future__ import annotations

import os
import pickle
import signal

import pytest
from ftjob_trainer import launch
from trainer_testlib import (
    TINY,
    events_of,
    finish,
    log_of,
    read_json,
    report_step,
    start_coordinator,
    wait_for,
)


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

    def round_of_two_trains():
        # On a loaded machine the second agent can come after the first one's last call (1 s): a round of one
        # forms and trains, and the second agent joins the next round. Wait until a worker of a round of two trained.
        docs = [read_json(tmp_path / f"{n}.json") or {} for n in agents]
        return any(d.get("world_size") == 2 and d.get("first_step") and d.get("step", 0) >= 3 for d in docs)

    wait_for(round_of_two_trains, timeout=240, proc=agents["a"], what="both agents training (step 3)")
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
