"""The trainer's structured events (contract.EVENT_*) read back into a timeline: the steps, the steps lost, and
every resume with the breakdown of its recovery, pod by pod.

Stdlib and ftjob_trainer.contract only: the demo, the end-to-end tests, bench/local_recovery.py and
bench/recovery_gpu.py (on a GPU host without the local cluster's dependencies) share it. Events are dicts as
contract.parse_event returns them, plus "pod": the pod (or, in a bench, the launch) whose log held the line.

A round is one start of training: the processes whose process groups came up together (init_process_group is a
collective, so their process_group_ready events are moments apart; each process belongs to the round of the
nearest rank 0). A resume is a round whose rank 0 loaded a checkpoint; the round before it is the one that stopped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftjob_trainer import contract

from .layout import log_path

WORKER_CONTAINER = "trainer"  # render.WORKER_CONTAINER (the operator's; ftjob_local does not import it)

# The moments of a recovery, in the order they happen (a replacement's "exited" is the process it replaces).
MOMENTS = (
    "signal",  # the stop signal reached the preempted trainer (its handler's clock)
    "stop_committed",  # rank 0 committed the stop checkpoint (or found the stop step committed already)
    "exited",  # the old trainer process exited
    "process_started",  # the OS started the new trainer process (contract: process_started.started_at)
    "imported",  # its interpreter and imports were up (the process_started event itself)
    "process_group_ready",
    "model_built",
    "checkpoint_loaded",
    "first_step",  # the first step the new process finished
)
ROLES = ("survivor", "replacement")  # a survivor restarts in its own pod; a replacement pod is new

Event = dict[str, Any]


# ================================================================================================ reading
def pod_events(text: str, pod: str) -> list[Event]:
    """The events in one log's text, each marked with the pod it came from."""
    return [{**ev, "pod": pod} for ev in contract.parse_events(text.splitlines())]


def read_job_events(state_dir: Path, namespace: str, job: str) -> list[Event]:
    """Every worker pod's trainer events from the logs the local kubelet wrote (they outlive the pods), in time
    order. A container's log holds all of torchrun's restarts of the trainer; the previous log, the container's
    restart before."""
    events: list[Event] = []
    root = Path(state_dir) / "logs" / namespace
    for pod_dir in sorted(root.glob(f"{job}-worker-*")):
        for previous in (True, False):
            f = log_path(state_dir, namespace, pod_dir.name, WORKER_CONTAINER, previous=previous)
            if f.exists():
                events += pod_events(f.read_text(errors="replace"), pod_dir.name)
    return sorted(events, key=lambda e: e["time"])


def of(events: Iterable[Event], name: str, **match: Any) -> list[Event]:
    """The events of one name whose fields equal `match`, in the order given."""
    return [e for e in events if e["event"] == name and all(e.get(k) == v for k, v in match.items())]


# ================================================================================================ processes
@dataclass
class Process:
    """One trainer process: the events of one pid in one pod."""

    pod: str
    pid: int
    events: list[Event] = field(default_factory=list)

    def first(self, name: str) -> Event | None:
        return next((e for e in self.events if e["event"] == name), None)

    def at(self, name: str) -> float | None:
        ev = self.first(name)
        return ev["time"] if ev else None

    @property
    def rank(self) -> int | None:
        return next((e["rank"] for e in self.events if e.get("rank") is not None), None)

    @property
    def started_at(self) -> float | None:
        ev = self.first(contract.EVENT_PROCESS_STARTED)
        return ev.get("started_at", ev["time"]) if ev else None


def processes(events: Iterable[Event]) -> list[Process]:
    """The trainer processes, in the order of their first event."""
    by_key: dict[tuple[str, int], Process] = {}
    for ev in sorted(events, key=lambda e: e["time"]):
        key = (ev.get("pod", ""), ev["pid"])
        by_key.setdefault(key, Process(*key)).events.append(ev)
    return list(by_key.values())


@dataclass
class Round:
    rank0: Process
    members: list[Process]  # rank 0 included

    def pods(self) -> list[str]:
        return sorted({p.pod for p in self.members})


def rounds(procs: list[Process]) -> list[Round]:
    """Processes grouped by the process group they formed, in time order (see the module docstring)."""
    ready = [p for p in procs if p.at(contract.EVENT_PROCESS_GROUP_READY) is not None]
    heads = sorted((p for p in ready if p.rank == 0), key=lambda p: p.at(contract.EVENT_PROCESS_GROUP_READY))
    out = [Round(h, []) for h in heads]
    for p in ready:
        if out:
            t = p.at(contract.EVENT_PROCESS_GROUP_READY)
            nearest = min(out, key=lambda r: abs(r.rank0.at(contract.EVENT_PROCESS_GROUP_READY) - t))
            nearest.members.append(p)
    return out


def training_pods(events: Iterable[Event]) -> list[str]:
    """The pods training now: those with a process in the newest round that has not exited (a warm spare waiting in
    the rendezvous has none)."""
    rs = rounds(processes(events))
    return sorted({p.pod for p in rs[-1].members if p.at(contract.EVENT_EXIT) is None}) if rs else []


# ================================================================================================ recovery
@dataclass
class PodRecovery:
    """One pod's way back into training after a stop: the moments (MOMENTS; None where no event says) and what
    its processes loaded. With several processes in a pod each moment is the latest of them (the pod is as ready as
    its slowest rank)."""

    pod: str
    role: str  # ROLES
    replaces: list[str]  # a replacement: the pods of the stopped round that are gone
    moments: dict[str, float | None]
    load_bytes: int | None = None  # the bytes of state its processes read
    load_seconds: float | None = None  # the longest read among them
    load_gbps: float | None = None

    def total(self) -> float | None:
        """Signal -> this pod's first step."""
        s, f = self.moments.get("signal"), self.moments.get("first_step")
        return f - s if s is not None and f is not None else None


@dataclass
class Resume:
    """One restart of training: what stopped, at which step, what was saved, when training went on."""

    from_step: int  # the checkpoint step rank 0 loaded
    t_started: float  # rank 0's new process logged its start (imports done)
    t_loaded: float  # rank 0 loaded the checkpoint
    t_first_step: float | None  # rank 0's first step after the load
    world_size_pods: int  # pods with a process in the new round
    pods: list[PodRecovery]
    stop_steps: list[int] = field(
        default_factory=list
    )  # steps the stopped round's ranks stopped at (exit 75)
    stop_reasons: list[str] = field(default_factory=list)  # their exit reasons (contract.REASON_*)
    t_stop: float | None = None  # the last exit of the stopped round
    t_signal: float | None = None  # the first stop signal a process of the stopped round received
    t_commit: float | None = None  # the stop checkpoint was durable
    save_seconds: float | None = None  # signal -> committed
    t_kept_step: float | None = None  # rank 0 trained the loaded step (its last step event before the resume)

    def pod(self, role: str) -> PodRecovery | None:
        return next((p for p in self.pods if p.role == role), None)

    @property
    def lost_s(self) -> float | None:
        """Training time this resume lost: from the last kept step to the first step after it (as the operator's
        status.progress.lost counts it, here from the trainer's own clock)."""
        if self.t_first_step is None or self.t_kept_step is None:
            return None
        return self.t_first_step - self.t_kept_step


def _latest(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _exit_time(procs: Iterable[Process]) -> float | None:
    return _latest(p.at(contract.EVENT_EXIT) for p in procs)


def _stop_commit(stopped: Round | None, stop_steps: list[int], after: float | None) -> float | None:
    """When the stop step became durable: rank 0's commit of a stop save, or its finding that the step was
    committed already."""
    if stopped is None or not stop_steps:
        return None
    head = stopped.rank0
    commits = [
        e
        for e in head.events
        if e["event"] == contract.EVENT_CHECKPOINT_COMMITTED
        and e.get("step") in stop_steps
        and (after is None or e["time"] >= after)
    ]
    skipped = [
        e
        for e in head.events
        if e["event"] == contract.EVENT_CHECKPOINT_SKIPPED and e.get("reason") == "already-committed"
    ]
    found = commits or skipped
    return found[-1]["time"] if found else None


def _pod_recovery(
    pod: str, new: Round, stopped: Round | None, moments: dict[str, float | None]
) -> PodRecovery:
    mine = [p for p in new.members if p.pod == pod]
    before = [p for p in stopped.members if p.pod == pod] if stopped else []
    gone = sorted(set(stopped.pods()) - set(new.pods())) if stopped else []
    role = "survivor" if before else "replacement"
    # a survivor's own old process; a replacement's: the processes of the pods it replaces
    exited = _exit_time(before or [p for p in (stopped.members if stopped else []) if p.pod in gone])
    loads = [p.first(contract.EVENT_CHECKPOINT_LOADED) for p in mine]
    loads = [e for e in loads if e is not None]
    rec = PodRecovery(
        pod,
        role,
        [] if before else gone,
        {
            **moments,
            "exited": exited,
            "process_started": _latest(p.started_at for p in mine),
            "imported": _latest(p.at(contract.EVENT_PROCESS_STARTED) for p in mine),
            "process_group_ready": _latest(p.at(contract.EVENT_PROCESS_GROUP_READY) for p in mine),
            "model_built": _latest(p.at(contract.EVENT_MODEL_BUILT) for p in mine),
            "checkpoint_loaded": _latest(e["time"] for e in loads),
            "first_step": _latest(p.at(contract.EVENT_FIRST_STEP) for p in mine),
        },
    )
    if loads and all(e.get("bytes") is not None for e in loads):
        rec.load_bytes = sum(int(e["bytes"]) for e in loads)
        rec.load_seconds = _latest(e.get("seconds") for e in loads)
        if rec.load_seconds:
            rec.load_gbps = rec.load_bytes / rec.load_seconds / 1e9
    return rec


def resume_of(new: Round, stopped: Round | None) -> Resume | None:
    """The resume that round `new` is, after round `stopped` (None: nothing before it in the logs)."""
    loaded = new.rank0.first(contract.EVENT_CHECKPOINT_LOADED)
    if loaded is None:
        return None  # a fresh start, not a resume
    exits = [p.first(contract.EVENT_EXIT) for p in stopped.members] if stopped else []
    exits = [e for e in exits if e is not None]
    signals = [p.first(contract.EVENT_STOP_SIGNAL) for p in stopped.members] if stopped else []
    t_signal = min((e.get("signal_time", e["time"]) for e in signals if e is not None), default=None)
    stop_steps = sorted(
        {e["step"] for e in exits if e.get("code") == contract.EXIT_RESTART and e.get("step")}
    )
    t_commit = _stop_commit(stopped, stop_steps, t_signal)
    moments = {"signal": t_signal, "stop_committed": t_commit}
    return Resume(
        from_step=int(loaded["step"]),
        t_started=new.rank0.at(contract.EVENT_PROCESS_STARTED) or loaded["time"],
        t_loaded=loaded["time"],
        t_first_step=new.rank0.at(contract.EVENT_FIRST_STEP),
        world_size_pods=len(new.pods()),
        pods=[_pod_recovery(pod, new, stopped, moments) for pod in new.pods()],
        stop_steps=stop_steps,
        stop_reasons=sorted({e.get("reason") or "" for e in exits}),
        t_stop=max((e["time"] for e in exits), default=None),
        t_signal=t_signal,
        t_commit=t_commit,
        save_seconds=t_commit - t_signal if t_commit is not None and t_signal is not None else None,
    )


# ================================================================================================ the whole job
@dataclass
class Analysis:
    steps: list[tuple[float, int]]  # (time, step) of every rank-0 step event, in time order
    final_step: int
    trained_twice: int  # steps rank 0 reported more than once
    skipped: int  # steps 1..final never reported
    resumes: list[Resume]
    done_at: float | None  # rank 0 exited 0
    first_step_at: float | None
    commits: list[tuple[float, int]]  # rank 0's committed checkpoints
    requested_saves: list[tuple[float, int]]  # saves rank 0 started for a coordinator request

    @property
    def lost_steps(self) -> int:
        return self.trained_twice + self.skipped

    @property
    def lost_seconds(self) -> float:
        """The resumes' lost time (Resume.lost_s), where the events say."""
        return sum(r.lost_s for r in self.resumes if r.lost_s is not None)


def analyze(events: list[Event]) -> Analysis:
    """Steps, resumes and lost steps (exact only when the trainer reports every step: --log-every 1)."""
    events = sorted(events, key=lambda e: e["time"])
    rank0 = [e for e in events if e.get("rank") == 0]
    steps = [(e["time"], int(e["step"])) for e in of(rank0, contract.EVENT_STEP)]
    counts = Counter(s for _, s in steps)
    final = max(counts, default=0)
    rs = rounds(processes(events))
    resumes = [r for i, new in enumerate(rs) if (r := resume_of(new, rs[i - 1] if i else None))]
    for r in resumes:  # when the loaded step was trained: its last report before this resume started
        r.t_kept_step = max((t for t, s in steps if s == r.from_step and t < r.t_started), default=None)
    done = of(rank0, contract.EVENT_EXIT, code=contract.EXIT_DONE)
    return Analysis(
        steps=steps,
        final_step=final,
        trained_twice=sum(c - 1 for c in counts.values()),
        skipped=len(set(range(1, final + 1)) - set(counts)),
        resumes=resumes,
        done_at=done[0]["time"] if done else None,
        first_step_at=steps[0][0] if steps else None,
        commits=[(e["time"], int(e["step"])) for e in of(rank0, contract.EVENT_CHECKPOINT_COMMITTED)],
        requested_saves=[(e["time"], int(e["step"])) for e in of(rank0, contract.EVENT_CHECKPOINT_REQUESTED)],
    )


def breakdown_rows(rec: PodRecovery) -> list[tuple[str, float | None, float | None]]:
    """(moment, seconds since the signal, seconds since the moment before) for every moment, None where unknown."""
    t0 = rec.moments.get("signal")
    rows, last = [], None
    for m in MOMENTS:
        t = rec.moments.get(m)
        since = t - t0 if t is not None and t0 is not None else None
        step = t - last if t is not None and last is not None else None
        rows.append((m, since, step))
        if t is not None:
            last = t
    return rows
