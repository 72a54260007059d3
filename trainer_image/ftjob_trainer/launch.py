"""`python -m ftjob_trainer.launch [torchrun flags] PROGRAM [ARGS]`: torchrun, back to training sooner after a loss.

It takes torchrun's own flags and program (the operator renders a worker container as `python -m
ftjob_trainer.launch <torchrun flags> -m ftjob_trainer.train`) and runs torchrun's own elastic agent, with these
changes, each switchable and measured in bench/RESULTS.md (issue 10):

Warm workers (FTJOB_WARM_WORKERS). torchrun starts every worker as a new interpreter that imports torch and the
trainer again (2-5 s on two cores), after every rendezvous: on the critical path of every recovery, survivors
included. Here a forkserver (multiprocessing's) starts before the agent imports torch, imports torch and the
trainer once while the agent joins the rendezvous, and every worker, the first and each one torchrun restarts
after a preemption save or a membership change, is forked from it in milliseconds (ftjob_trainer.warm_worker runs
first in it). The forkserver only imports: no CUDA (a forked child initialises its own). Off: torchrun's own
subprocess workers, for a program that must not start from a forked, imported torch.

Leaving the rendezvous (FTJOB_LEAVE_RENDEZVOUS). torchrun's agent, stopped by SIGTERM, waits for its workers (their
preemption save) and exits without telling its peers; the next c10d round can only form once its keep-alive
expires (keep_alive_interval x keep_alive_max_attempt), and one that waited (a new agent, a warm spare) keeps its
peers restarting until then. Here the stopped agent removes itself from the rendezvous before it exits, as a
restarting survivor's agent does before it rejoins. A hard kill still ends with the keep-alive. It leaves as soon as
its preempted worker's stop checkpoint is durable (the worker creates FTJOB_STOP_COMMITTED_FILE, a path the launcher
gives it), not when that worker has exited: the worker's teardown after the commit (its pinned memory, the process
group; 2-3 s at the 1b preset on the H200) no longer delays the round a warm spare or a new pod waits for. Nothing
of the old world writes to the checkpoints after that commit.

Polling while a round forms (FTJOB_RENDEZVOUS_POLL_SECONDS). c10d's agents read the shared rendezvous state at
most once a second while they wait for a round to form, so the last one to learn that it formed learns it up to a
second late. Here they read it every POLL_SECONDS_PER_NODE x max nodes seconds, 0.1 s to c10d's 1 s, and only while
a round forms (the membership checks during training keep c10d's 1 s).

A shorter exit barrier (FTJOB_EXIT_BARRIER_SECONDS, default 30). torchrun's agent, once its workers finished,
waits up to 300 s for every agent of its round to finish too, a guard for an agent that hosts the rendezvous store
(here the coordinator pod hosts it: is_host=0). A peer stopped by a preemption never arrives: a job that finished
its last step during a peer's notice kept its finished pod running for 5 minutes while the operator replaced the
lost one. Here the wait is 30 s (finished peers arrive within a second or two of each other, after the last
collective save), and the operator takes one pod's exit 0 as the job's end.

torch < 2.12's torchrun has no --shutdown-timeout (its agent gives workers a fixed 30 s after it forwards a stop
signal, before SIGKILL): there the launcher drops the flag and gives the agent's close of its workers that timeout
instead, so the operator's save deadline holds on the GPU image's torch 2.11 too.

A spare left out when its job's world ends waits to be removed. An agent waiting in c10d's redundancy list (a warm
spare, or a replacement that found the round full) learns that the rendezvous closed when the agents of the round
end without a signal: after the job's last step, or after their workers failed. torchrun's agent then returns no
result and torchrun itself fails on that (exit 1), which the operator reads as a worker failure and can read before
the finished pods' exit 0: a job that succeeded was restarted. The spare cannot tell success from failure, and
either exit code would speak for the job, so it says why in an event (rendezvous_closed) and waits for the operator,
which removes it with the job's other pods, or for any signal.

Reading ahead (FTJOB_READ_AHEAD). Once a round forms, the agent reads the checkpoint its workers will load into the
node's page cache while they are forked and build their model; a job of one node (torchrun's --nnodes) starts
before its imports (ftjob_trainer.read_ahead says what and why).

The agent's own restarts of its workers (a node joined the round, or a worker failed) stop the built-in trainer with
its peer-stop signal, not a preemption's SIGTERM (a correctness fix, not switchable: ftjob_trainer.peer_restart).

A stopped agent exits without the interpreter's finalization. Once its workers are gone and it left the
rendezvous, the agent prints the signal's traceback and exits 1 as torchrun does, after the atexit handlers, but
without tearing down torch's modules and libraries: 0.7 s on two cores with the tiny model, which a replacement that
starts only once the old pod has ended would wait out (bench/RESULTS.md).

Its start-up as events (contract.py): launcher_ready (the agent's imports), warm_imports_done (the forkserver's) and
round_formed (each round the agent joined), so a replacement's path to its first worker reads as its parts.

These reach into torchrun's internals (its config_from_args, its agent's run, the rendezvous registry, c10d's exit operation, its
poll delay and state cache); each is feature-detected and leaves torchrun's plain behaviour where a torch version
lacks what it uses.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ftjob_trainer import contract, events, peer_restart  # torch-free
from ftjob_trainer.torchrun_args import (
    BUILTIN_TRAINER,
    builtin_trainer_args,
    knows_flag,
    most_nodes,
    without_shutdown_flag,
)

log = logging.getLogger("ftjob.launch")

ENV_WARM_WORKERS = "FTJOB_WARM_WORKERS"
ENV_LEAVE_RENDEZVOUS = "FTJOB_LEAVE_RENDEZVOUS"
ENV_POLL_SECONDS = "FTJOB_RENDEZVOUS_POLL_SECONDS"  # unset: from the node count; a number: that
ENV_EXIT_BARRIER_SECONDS = "FTJOB_EXIT_BARRIER_SECONDS"
EXIT_BARRIER_SECONDS = 30.0
WORKER_ENTRY = "ftjob_trainer.warm_worker"
FORKSERVER_FIRST = "ftjob_trainer.warm_forkserver"  # its own session: pod-wide signals do not reach it
FORKSERVER_LAST = "ftjob_trainer.warm_imported"  # says the forkserver's imports are done (an event)
LEAVE_SECONDS = 5.0  # the most a stopped agent spends leaving (a store round trip or two)
COMMITTED_POLL_SECONDS = 0.05  # how often the agent looks for its worker's FTJOB_STOP_COMMITTED_FILE
C10D_POLL_SECONDS = 1.0  # c10d's delay between reads of the state while it waits, and its state cache
# Every waiting agent reads the whole state (which grows with the nodes) each poll: 0.1 s up to 10 nodes, then
# slower, c10d's 1 s from 100 nodes on.
POLL_SECONDS_PER_NODE, MIN_POLL_SECONDS = 0.01, 0.1


def enabled(name: str, env: dict[str, str] | None = None) -> bool:
    """An on/off switch read from the environment: on unless 0/false/no/off."""
    value = (os.environ if env is None else env).get(name, "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


# ================================================================================================ warm workers
def preload_modules(argv: list[str]) -> list[str]:
    """What the forkserver imports, in order: its own session first, the worker entry and torch; for the built-in
    trainer (`-m ftjob_trainer.train` among the arguments, read before torch's parser is imported: a miss costs a
    worker some imports, never a wrong program) also the trainer and what torch imports lazily on its way to a
    first step (torch._dynamo: FSDP2's first fully_shard imports it, 1.4-2.1 s on two cores)."""
    modules = [FORKSERVER_FIRST, WORKER_ENTRY, "torch", "torch.distributed"]
    if builtin_trainer_args(argv) is not None:
        modules += ["torch._dynamo", BUILTIN_TRAINER, "ftjob_trainer.models"]
    return [*modules, FORKSERVER_LAST]


def builtin_trainer_imports() -> list[str]:
    """The modules the built-in trainer's forkserver imports, less the two with side effects (a new session, an
    event): what the trainer image compiles at build and the recovery bench times."""
    return [
        m for m in preload_modules(["-m", BUILTIN_TRAINER]) if m not in (FORKSERVER_FIRST, FORKSERVER_LAST)
    ]


def start_forkserver(modules: list[str]) -> None:
    """Starts multiprocessing's forkserver; it imports `modules` in the background, in order."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(modules)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # as torchrun's `python -u`: workers share its stdout
    multiprocessing.forkserver.ensure_running()


def warm_config(config_from_args: Callable) -> Callable:
    """torchrun's config_from_args, with a Python program turned into warm_worker.run forked from the forkserver."""
    from ftjob_trainer import warm_worker

    def config(args: Any) -> tuple[Any, Any, list[str]]:
        cfg, cmd, cmd_args = config_from_args(args)
        if isinstance(cmd, str) and cmd_args[:1] == ["-u"]:  # `python -u [-m] PROGRAM ...`, not --no-python
            cfg.start_method = "forkserver"
            return cfg, warm_worker.run, cmd_args[1:]
        if callable(cmd):  # --run-path: torchrun's own function entrypoint
            cfg.start_method = "forkserver"
        return cfg, cmd, cmd_args

    return config


class WorkerExitWithoutTraceback(logging.Filter):
    """torchrun logs a function worker that exited with a code (75 after every preemption save) with the agent's
    own traceback of torch.multiprocessing's join, which says nothing the message does not, and formatting any
    traceback makes torch's log formatter import torch._dynamo: 1.4-9 s on two cores, in the middle of every
    survivor's restart. The message stays; that traceback goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and type(error).__name__ == "ProcessExitedException":
            record.exc_info, record.exc_text = None, None
        return True


# ================================================================================================ the rendezvous
def poll_seconds(max_nodes: int, env: dict[str, str] | None = None) -> float:
    value = (os.environ if env is None else env).get(ENV_POLL_SECONDS, "").strip()
    if value:
        return max(0.01, float(value))
    return min(C10D_POLL_SECONDS, max(MIN_POLL_SECONDS, POLL_SECONDS_PER_NODE * max_nodes))


def poll_faster_while_forming(handler: Any, poll: float) -> bool:
    """While this agent runs a rendezvous operation (join, exit), it reads the state every `poll` seconds; False
    where this torch's handler lacks what that needs."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    executor = getattr(handler, "_op_executor", None)
    holder = getattr(handler, "_state_holder", None)
    delay = getattr(dr, "_delay", None)
    if (
        executor is None
        or not hasattr(holder, "_cache_duration")
        or delay is None
        or poll >= C10D_POLL_SECONDS
    ):
        return False
    run = executor.run

    def run_polling_faster(*args: Any, **kwargs: Any) -> Any:
        cached = holder._cache_duration
        holder._cache_duration = poll
        try:
            return run(*args, **kwargs)
        finally:
            holder._cache_duration = cached

    def shorter_poll(seconds: float | tuple[float, float]) -> None:  # c10d passes it by name
        delay(seconds=poll if seconds == C10D_POLL_SECONDS else seconds)  # the poll; its random skew stays

    executor.run = run_polling_faster
    dr._delay = shorter_poll
    return True


def leave(handler: Any, seconds: float = LEAVE_SECONDS) -> bool:
    """Removes this agent from its c10d rendezvous: from the round's participants (what c10d's own exit operation
    does for a restarting agent before it rejoins), the wait list or the redundancy list (a warm spare's place);
    False where this torch's handler lacks what that needs. The keep-alive stops first, so nothing writes this
    agent back."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    actions = getattr(dr, "_Action", None)
    executor = getattr(handler, "_op_executor", None)
    stop_heartbeats = getattr(handler, "_stop_heartbeats", None)
    needed = ("REMOVE_FROM_PARTICIPANTS", "REMOVE_FROM_WAIT_LIST", "REMOVE_FROM_REDUNDANCY_LIST", "FINISH")
    if executor is None or stop_heartbeats is None or not all(hasattr(actions, a) for a in needed):
        return False

    def leave_op(ctx: Any, deadline: float) -> Any:
        state = ctx.state
        if time.monotonic() > deadline:
            return actions.ERROR_TIMEOUT
        if ctx.node in state.participants:
            return actions.REMOVE_FROM_PARTICIPANTS
        if ctx.node in state.wait_list:
            return actions.REMOVE_FROM_WAIT_LIST
        if ctx.node in getattr(state, "redundancy_list", ()):
            return actions.REMOVE_FROM_REDUNDANCY_LIST
        return actions.FINISH

    stop_heartbeats()
    executor.run(leave_op, time.monotonic() + seconds)
    return True


def tuned_handlers(
    get_handler: Callable, into: list, on_round: Callable[[int, int], None] | None = None
) -> Callable:
    """The rendezvous registry's get_rendezvous_handler, keeping each handler (to leave it) and tuning its poll;
    on_round(node rank, nodes) runs once each round formed."""

    def get(params: Any) -> Any:
        handler = get_handler(params)
        into.append(handler)
        seconds = poll_seconds(int(getattr(params, "max_nodes", 1) or 1))
        if poll_faster_while_forming(handler, seconds):
            log.info("rendezvous: polling every %.2fs while a round forms", seconds)
        next_rendezvous = handler.next_rendezvous

        def next_round(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            joined = next_rendezvous(*args, **kwargs)
            events.emit(contract.EVENT_ROUND_FORMED, seconds=round(time.monotonic() - started, 4))
            node = node_of(joined)
            if on_round is not None and node is not None:
                on_round(*node)
            return joined

        handler.next_rendezvous = next_round
        return handler

    return get


def node_of(joined: Any) -> tuple[int, int] | None:
    """(this node's rank, nodes) of a round: a RendezvousInfo, or an older torch's (store, rank, world size)."""
    if hasattr(joined, "rank") and hasattr(joined, "world_size"):
        return int(joined.rank), int(joined.world_size)
    if isinstance(joined, tuple) and len(joined) == 3:
        return int(joined[1]), int(joined[2])
    return None


def leave_all(handlers: list, why: str) -> None:
    """Leave every rendezvous this agent joined (each once: the stop commit's watcher and the exit both call it)."""
    started = time.monotonic()
    while handlers:
        handler = handlers.pop()
        try:
            left = leave(handler)
        except Exception as err:  # noqa: BLE001 - the keep-alive's expiry is the fallback: say so, go on
            log.warning("could not leave the rendezvous (%s); peers wait for its keep-alive to expire", err)
            continue
        if left:
            events.emit(contract.EVENT_RENDEZVOUS_LEFT, why=why, seconds=round(time.monotonic() - started, 4))


class LeaveOnStopCommit:
    """Leaves the rendezvous once a worker of this agent says its stop checkpoint is durable: it creates the file
    named in its FTJOB_STOP_COMMITTED_FILE (ftjob_trainer.stopping). Made before the forkserver starts: warm workers
    inherit its environment, not the agent's."""

    def __init__(self, handlers: list):
        self.handlers = handlers
        self.folder = tempfile.mkdtemp(prefix="ftjob-launch-")
        self.path = os.path.join(self.folder, "stop-committed")
        os.environ[contract.ENV_STOP_COMMITTED_FILE] = self.path
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="ftjob-leave-on-stop-commit", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _watch(self) -> None:
        while not self.closing.wait(COMMITTED_POLL_SECONDS):
            if os.path.exists(self.path):
                leave_all(self.handlers, contract.LEFT_STOP_COMMITTED)
                return

    def close(self) -> None:
        """Stop watching; a leave in progress finishes first (the exit's own leave_all finds nothing left)."""
        self.closing.set()
        if self.thread.is_alive():
            self.thread.join(LEAVE_SECONDS)
        shutil.rmtree(self.folder, ignore_errors=True)


# ================================================================================================ the exit barrier
def exit_barrier_seconds(env: dict[str, str] | None = None) -> float:
    value = (os.environ if env is None else env).get(ENV_EXIT_BARRIER_SECONDS, "").strip()
    return max(0.0, float(value)) if value else EXIT_BARRIER_SECONDS


def shorter_exit_barrier(seconds: float) -> bool:
    """torchrun's agents wait `seconds` in the exit barrier instead of 300; False where this torch's agent takes no
    such argument (its launcher builds the agent by the name patched here)."""
    import inspect

    from torch.distributed.launcher import api

    agent = getattr(api, "LocalElasticAgent", None)
    if agent is None or "exit_barrier_timeout" not in inspect.signature(agent.__init__).parameters:
        return False

    class Agent(agent):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("exit_barrier_timeout", seconds)
            super().__init__(*args, **kwargs)

    api.LocalElasticAgent = Agent
    return True


# ================================================================================================ older torchruns
def close_workers_within(seconds: int) -> bool:
    """The agent's close of its workers (on a stop signal, and before a restart) waits `seconds` before SIGKILL
    instead of torch's fixed 30; False where this torch's close takes no timeout."""
    import inspect

    from torch.distributed.elastic.multiprocessing import api as processes

    close = processes.PContext.close
    if "timeout" not in inspect.signature(close).parameters:
        return False

    def close_within(self: Any, death_sig: Any = None, timeout: float = seconds) -> None:
        close(self, death_sig, timeout)

    processes.PContext.close = close_within
    return True


# ================================================================================================ a spare left out
def wait_when_left_out(run: Callable) -> Callable:
    """torchrun's agent's run, waiting until a signal ends this process where it returns no result (this agent was
    in the redundancy list when the rendezvous closed: torch's RendezvousGracefulExitError)."""

    def run_or_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = run(self, *args, **kwargs)
        if result is None:
            events.emit(contract.EVENT_RENDEZVOUS_CLOSED)
            log.info(
                "the rendezvous closed while this agent waited as a spare (the job's workers ended): waiting to be "
                "removed with the job's pods; any signal ends it"
            )
            while True:
                signal.pause()
        return result

    return run_or_wait


# ================================================================================================ main
def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s launch %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def reading_ahead(argv: list[str]) -> Any:
    """The built-in trainer's read-ahead (ftjob_trainer.read_ahead), or None: switched off, another program, or no
    local checkpoint folder (a command line the trainer refuses: the worker says what is wrong with it)."""
    from ftjob_trainer import read_ahead  # torch-free: DCP is imported only to read a checkpoint

    trainer_args = builtin_trainer_args(argv)
    if trainer_args is None or not enabled(read_ahead.ENV_READ_AHEAD):
        return None
    source = read_ahead.checkpoint_source(trainer_args)
    return read_ahead.ReadAhead(*source) if source else None


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    handlers: list = []  # the rendezvous this agent joins (tuned_handlers fills it)
    leaving = LeaveOnStopCommit(handlers) if enabled(ENV_LEAVE_RENDEZVOUS) else None
    warm = enabled(ENV_WARM_WORKERS) and not {"--no-python", "--no_python"} & set(argv)
    if warm:
        start_forkserver(preload_modules(argv))  # before our own imports: the two import side by side
    reader = reading_ahead(argv)
    if reader is not None and most_nodes(argv) == 1:
        reader.before_round()  # one node loads every file, whatever the round: read while torch imports
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.agent.server import api as agents
    from torch.distributed.elastic.agent.server import local_elastic_agent as local_agents
    from torch.distributed.elastic.multiprocessing import api as processes
    from torch.distributed.elastic.rendezvous import registry

    _log_to_stderr()
    events.emit(contract.EVENT_LAUNCHER_READY, since_start_s=round(events.since_start(), 4), warm=warm)
    if not knows_flag(torchrun.get_args_parser(), "--shutdown-timeout"):
        argv, seconds = without_shutdown_flag(argv)
        if seconds is not None:
            kept = close_workers_within(seconds)
            log.info(
                "this torchrun has no --shutdown-timeout: %s",
                f"its agent's close waits {seconds}s" if kept else "workers get torchrun's fixed 30s",
            )
    barrier = exit_barrier_seconds()
    if not shorter_exit_barrier(barrier):
        log.info("this torchrun's agent takes no exit barrier timeout: it waits torchrun's own 300s")
    if warm and hasattr(torchrun, "config_from_args"):
        torchrun.config_from_args = warm_config(torchrun.config_from_args)
        getattr(processes, "logger", logging.getLogger(processes.__name__)).addFilter(
            WorkerExitWithoutTraceback()
        )
    if hasattr(agents, "SimpleElasticAgent"):
        agents.SimpleElasticAgent.run = wait_when_left_out(agents.SimpleElasticAgent.run)
    trainer_args = builtin_trainer_args(argv)
    peer_signal = None if trainer_args is None else peer_restart.peer_stop_signal(trainer_args)
    if peer_signal is not None:
        local = local_agents.LocalElasticAgent
        local._stop_workers = peer_restart.stop_workers_with(local._stop_workers, peer_signal)
    if hasattr(registry, "get_rendezvous_handler"):
        registry.get_rendezvous_handler = tuned_handlers(
            registry.get_rendezvous_handler, handlers, reader.round_formed if reader else None
        )
    if leaving:
        leaving.start()
    try:
        torchrun.main(argv)  # parses, launches, waits; @record writes the error file as torchrun's does
    except processes.SignalException as e:
        if leaving:
            leaving.close()
            leave_all(handlers, e.sigval.name)
        exit_stopped(e)
    finally:
        if leaving:
            leaving.close()


def exit_stopped(error: BaseException) -> NoReturn:
    """The end of an agent stopped by a signal, whose workers are gone: what an uncaught exception does (its
    traceback, the atexit handlers, exit 1), less the interpreter's finalization."""
    sys.excepthook(type(error), error, error.__traceback__)
    atexit._run_exitfuncs()  # logging's flush and multiprocessing's clean-up among them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    main()
