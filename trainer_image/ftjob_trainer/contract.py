"""The contract between the operator and the trainer: exit codes, ports, environment, the coordinator's HTTP API.

Torch-free on purpose: the operator imports this module and its image has no torch. Change it only together
with both sides; tests/test_contract.py pins the values.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

# --- Exit codes of `python -m ftjob_trainer.train` -------------------------------------------------------------
EXIT_DONE = 0  # the last step is done: the only success
EXIT_ERROR = 1  # a real error (a bug, a bad checkpoint that left nothing to load, a failed collective)
EXIT_CONFIG_ERROR = 2  # bad flags or environment: retrying will not help
# A checkpoint was committed (or the last committed one was kept because a save could not fit the deadline) and
# the process stopped on purpose: preempted ranks and the survivors of a peer's preemption or a membership change.
# torchrun restarts such workers into a new rendezvous; never 0, because 0 makes the agent treat the job as done.
EXIT_RESTART = 75  # EX_TEMPFAIL

# --- Ports -----------------------------------------------------------------------------------------------------
RDZV_PORT = 29400  # the coordinator's TCPStore (c10d rendezvous backend, `--rdzv-endpoint`)
CONTROL_PORT = 29401  # the coordinator's HTTP control API

# --- Environment the operator sets on worker containers ---------------------------------------------------------
ENV_TOKEN = "FTJOB_TOKEN"  # the job's control-API token (from the Secret the operator owns)
ENV_COORDINATOR_URL = "FTJOB_COORDINATOR_URL"  # e.g. http://10.96.0.12:29401
ENV_SAVE_DEADLINE = "FTJOB_SAVE_DEADLINE_SECONDS"  # seconds a preemption save may take, SIGTERM to committed
ENV_TERMINATION_LOG = "FTJOB_TERMINATION_LOG"  # default /dev/termination-log
ENV_JOB_NAME = "FTJOB_JOB_NAME"
ENV_NAMESPACE = "FTJOB_NAMESPACE"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# Set by the launcher (ftjob_trainer.launch) for its workers: a preempted worker creates this file once its stop
# checkpoint is durable, and the launcher's agent leaves the rendezvous then, before the worker's teardown.
ENV_STOP_COMMITTED_FILE = "FTJOB_STOP_COMMITTED_FILE"
# Every trainer flag --some-flag is also read from FTJOB_SOME_FLAG (flag wins).
ENV_FLAG_PREFIX = "FTJOB_"

# --- Node and pod signals the operator reads and the local cluster writes ------------------------------------------
# The local cluster (ftjob_local: kubelet, `ftjob local preempt`) imports these; the operator's planner still spells
# them out (TERMINATION_TAINTS, the DisruptionTarget checks).
TAINT_SPOT_INTERRUPTION = "aws-node-termination-handler/spot-itn"  # a spot interruption notice on the node
CONDITION_DISRUPTION_TARGET = "DisruptionTarget"  # the pod condition set before a disruption deletes the pod

# --- Coordinator HTTP API (JSON; every route but /healthz needs `Authorization: Bearer <token>`) -----------------
AUTH_HEADER = "Authorization"
ROUTE_HEALTH = "/healthz"  # GET -> 200 "ok"
ROUTE_PROGRESS = "/v1/progress"  # GET -> Progress; POST (rank 0) <- Progress fields it knows
ROUTE_CHECKPOINT = "/v1/checkpoint"  # POST {"reason": str} -> {"id": int}: ask every rank to save now
# POST by any rank that stops on a real error (exit code not 0 or 75), best effort, before it exits:
#   {"pod": str, "rank": int, "exitCode": int, "message": str, "step": int | None (the last step it finished)}
#   -> {"id": int}
# torchrun restarts such a worker inside its pod (its restart budget must stay huge for exit 75), so the pod never
# fails: this report is how the operator counts the failure.
ROUTE_ERROR = "/v1/error"
ENV_POD_NAME = "POD_NAME"  # the worker pod's name (fieldRef), named in error reports
# Fencing (issue 10): two worlds must never train and commit side by side (a starved agent dropped from the
# rendezvous keeps training while a new round forms). Rank 0 of every new world (its process group formed, nothing
# loaded yet) takes a world epoch; epochs only grow, also across coordinator restarts (milliseconds since the epoch,
# bumped past the last one; a restarted coordinator adopts the largest epoch presented to it):
#   POST /v1/world {"worldSize": int, "pod": str | None, "run": str | None} -> {"epoch": int}
# Before every checkpoint commit rank 0 asks whether its world is still the newest:
#   POST /v1/fence {"epoch": int, "step": int | None} -> 200 {"epoch": newest} | 409 {"error": str, "epoch": newest}
# A progress post carrying "worldEpoch" older than the newest is refused with 409 and not applied. A refused world
# commits nothing more and exits EXIT_RESTART (reason REASON_FENCED): its agent re-rendezvous, no failure counted.
ROUTE_WORLD = "/v1/world"
ROUTE_FENCE = "/v1/fence"
# Progress document keys (GET /v1/progress):
#   step: int | None, loss: float | None, worldSize: int | None, updatedAt: RFC 3339 str | None,
#   stepTime: RFC 3339 | None (when `step` finished), totalSteps: int | None (the step the run ends at),
#   tokensPerSecond: float | None (over the last few steps, checkpoint stalls included),
#   run: {"startedAt": RFC 3339 (rank 0's process start: it names the run), "resumedFromStep": int (0: fresh),
#         "resumedStepTime": RFC 3339 | None (when that step was first trained, from the checkpoint),
#         "firstStepTime": RFC 3339 | None (when this run finished its first step)} | None
#   (rank 0 posts all of these with every progress post; times of the trainer carry microseconds)
#   lastCheckpoint: {"step": int, "path": str, "time": RFC 3339 str} | None,
#   checkpointFailure: {"step": int, "kind": str, "message": str, "kept": str | None (the newest committed
#                       checkpoint's path then: it stays), "time": RFC 3339 str} | None
#                       (the newest save that failed and was dropped; training went on)
#   checkpointRequest: {"id": int, "reason": str} | None   (the newest request; rank 0 compares ids)
#   handledRequestId: int   (the newest request id a committed checkpoint answered)
#   lastError: {"id", "pod", "rank", "exitCode", "message", "step", "time"} | None   (the newest error report)
#   worldEpoch: int | None   (the newest world epoch handed out or seen: only that world may commit)
#   errors: [the same, oldest first]   (the newest ERRORS_KEPT reports: the first one names the root cause, later
#           ones are often peers whose collectives failed with it)
#   Error ids increase, also across coordinator restarts (milliseconds since the epoch, bumped past the last id),
#   so the operator keeps only the newest id it handled (status.operator.handledErrorId).
ERRORS_KEPT = 16
ERROR_MESSAGE_MAX = 1024  # characters of an error message the coordinator keeps (the end: where the error is)

# --- Termination message (JSON written to the termination log before exit) -------------------------------------
# {"step": int, "checkpoint": str | None, "reason": str, "exitCode": int, "message": str}
REASON_PREEMPTED = "preempted"  # this process got SIGTERM (or another stop signal)
REASON_PEER = "peer-stopped"  # another rank was signalled; this one stopped (and saved) with it
REASON_DEADLINE = "save-skipped-deadline"  # a save could not fit the deadline; the last committed one is kept
REASON_DONE = "done"
REASON_ERROR = "error"
# a newer world exists (see ROUTE_FENCE): this one stopped without committing, exit 75
REASON_FENCED = "fenced"


# --- Time on the wire ------------------------------------------------------------------------------------------
# RFC 3339 in UTC with a "Z", as Kubernetes writes it; the one home of these helpers for every part.
def format_time(t: datetime) -> str:
    """Seconds precision (metav1.Time)."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_time_micro(t: datetime) -> str:
    """Microseconds precision (metav1.MicroTime, as events and leases carry)."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_rfc3339() -> str:
    return format_time(datetime.now(timezone.utc))


def parse_time(s: str | None) -> datetime | None:
    """An aware UTC datetime, or None for an empty value. A malformed value raises ValueError."""
    if not s:
        return None
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(timezone.utc)


# --- Structured events (the trainer's log stream) --------------------------------------------------------------
# The trainer writes one JSON object per line for every moment that matters (ftjob_trainer/events.py, on stderr,
# flushed at once); the demo, the benches and the tests read these, never free-form log text. Every event has:
# "event" (a name below), "time" (unix seconds, float), "rank" (global rank: torchrun's RANK until the process
# group exists, null outside torchrun before it), "pid"; the rest are the fields listed per name. Durations are
# seconds ("seconds" or "*_s"), sizes bytes. Checkpoint events are emitted on every rank unless marked rank 0.
# A reader finds the object anywhere in the line (torchrun or the kubelet may prefix lines). Names and fields are
# stable: add, never rename.
EVENT_PROCESS_STARTED = "process_started"
# restart_count (torchrun's TORCHELASTIC_RESTART_COUNT), local_rank, world_size, started_at (unix: when the OS
# started this process), since_start_s (interpreter start and imports, up to this event)
EVENT_PROCESS_GROUP_READY = "process_group_ready"  # backend, world_size, seconds (init_process_group)
EVENT_MODEL_BUILT = "model_built"
# model, params (unsharded count), seconds (build + shard + optimizer), initialised (false: built on the meta
# device, a checkpoint fills it)
EVENT_CHECKPOINT_LOADED = "checkpoint_loaded"
# step, path, bytes (this rank's share of the state), seconds (the read), gbps (bytes / seconds / 1e9), read_bytes
# (of the files), total_s (checks, read, set into the model, RNG, agreement), tier (TIER_*: where this rank's files
# came from; "mixed": some from each), files_by_tier, bytes_by_tier ({tier: n}), threads (reading), committed
# (false: a memory-committed save), saved_world_size, direct_bytes (read from memory-tier files straight into their
# targets, not decoded)
EVENT_CHECKPOINT_REJECTED = "checkpoint_rejected"
# step, path, error, committed (true: set aside; false: a memory-committed save this world cannot read, discarded)
EVENT_FRESH_START = (
    "fresh_start"  # checkpoint_dir (null: none given): nothing committed, training starts at 0
)
EVENT_FIRST_STEP = "first_step"  # step, seconds (since process start): the first step this process finished
EVENT_STEP = "step"  # step, loss, tokens_per_s (rank 0, every --log-every steps)
EVENT_CHECKPOINT_REQUESTED = "checkpoint_requested"
# id, reason (rank 0 only: it polls the coordinator; null elsewhere), step (the step that is saved for it)
EVENT_CHECKPOINT_SAVE_STARTED = "checkpoint_save_started"
# step, kind (KIND_*), asynchronous, waits_for (the step of an async save that must finish first, or null)
EVENT_CHECKPOINT_STAGED = (
    "checkpoint_staged"  # step, kind, seconds (since save_started: the copy to host memory)
)
EVENT_CHECKPOINT_COMMITTED = "checkpoint_committed"
# rank 0 (its ftjob.json or rename is the commit): step, path, bytes (the directory's files, all ranks; null for
# tier memory), seconds (the save's own time, from after any wait for a previous save), kind, request_id (or null),
# tier: TIER_MEMORY (every rank's files written, some only in their pod's memory: .tmp-step-N) first, then
# TIER_DURABLE (step-N committed on the volume); a save written straight to the volume has only the durable one
EVENT_CHECKPOINT_SKIPPED = "checkpoint_skipped"
# step, kind, reason: "deadline" (a stop save could not fit: estimate_s, deficit_s, kept), "already-committed"
# (the stop step is committed already: kept), "failed" (a save's write failed on some rank: error, kept; not
# committed: a periodic or requested save is dropped and training goes on, a stop or final one ends the process),
# "fenced" (a newer world exists: not written, or written and not committed; see ROUTE_FENCE)
EVENT_STOP_SIGNAL = "stop_signal"
# signal, signal_time (unix, recorded by the handler), step (the last finished), since_signal_s: the loop saw it
EVENT_STOP_AGREED = (
    "stop_agreed"  # step, reason (REASON_PREEMPTED / REASON_PEER), since_signal_s (null: a peer's)
)
EVENT_FENCED = "fenced"
# every rank, when its world stops because a newer one exists: step (the last finished), epoch (this world's),
# newest (the coordinator's newest epoch, or null when only a peer knew), where ("commit", "progress", "error")
EVENT_EXIT = "exit"
# every process's last moment: code, reason (a REASON_* above), message, step, since_start_s, and teardown: seconds
# between the stop and the exit ({close_s: the checkpointer (an in-flight save drained, buffers freed) and the
# report; process_group_s})
EVENT_RENDEZVOUS_LEFT = "rendezvous_left"
# the launcher's agent (ftjob_trainer.launch; rank null) left its c10d rendezvous: why (LEFT_STOP_COMMITTED: its
# preempted worker's stop checkpoint is durable; else the stop signal's name, at the agent's exit), seconds
LEFT_STOP_COMMITTED = "stop-committed"
# The launcher's start-up (ftjob_trainer.launch; rank null), so a replacement's path to its first worker reads as
# its parts: the agent's imports, the forkserver's imports, the round.
EVENT_LAUNCHER_READY = (
    "launcher_ready"  # its agent imported torchrun: since_start_s, warm (a forkserver preloads)
)
EVENT_WARM_IMPORTS_DONE = "warm_imports_done"  # its forkserver imported what workers need: since_start_s
EVENT_RENDEZVOUS_CLOSED = "rendezvous_closed"
# the launcher's agent waited as a spare (c10d's redundancy list) and the rendezvous closed: the job's workers ended
# (done, or failed). It neither succeeds nor fails for the job: it waits until a signal ends it (the operator
# removes it with the job's pods)
EVENT_ROUND_FORMED = "round_formed"  # its agent's rendezvous round formed: seconds (from asking to joined)
EVENT_READ_AHEAD_DONE = "read_ahead_done"
# its agent read the checkpoint the round's workers will load into the page cache (ftjob_trainer.read_ahead): step,
# files, bytes, seconds (from the round, or from the launcher's start: before_round), threads, stopped (a read begun
# before the round that a newer save cut short)
# What a save is for (the "kind" of checkpoint events)
KIND_PERIODIC, KIND_REQUEST, KIND_STOP, KIND_FINAL = "periodic", "request", "stop", "final"
TIER_DURABLE = "durable"  # the checkpoint volume
TIER_MEMORY = "memory"  # the pod's node-local memory (--memory-checkpoint-dir on its /dev/shm volume)
TIER_MIXED = "mixed"  # a load that read some files from each
EVENTS = (
    EVENT_PROCESS_STARTED,
    EVENT_PROCESS_GROUP_READY,
    EVENT_MODEL_BUILT,
    EVENT_CHECKPOINT_LOADED,
    EVENT_CHECKPOINT_REJECTED,
    EVENT_FRESH_START,
    EVENT_FIRST_STEP,
    EVENT_STEP,
    EVENT_CHECKPOINT_REQUESTED,
    EVENT_CHECKPOINT_SAVE_STARTED,
    EVENT_CHECKPOINT_STAGED,
    EVENT_CHECKPOINT_COMMITTED,
    EVENT_CHECKPOINT_SKIPPED,
    EVENT_STOP_SIGNAL,
    EVENT_STOP_AGREED,
    EVENT_FENCED,
    EVENT_EXIT,
    EVENT_RENDEZVOUS_LEFT,
    EVENT_LAUNCHER_READY,
    EVENT_WARM_IMPORTS_DONE,
    EVENT_ROUND_FORMED,
    EVENT_READ_AHEAD_DONE,
    EVENT_RENDEZVOUS_CLOSED,
)
_EVENT_MARK = '{"event": '


def event_line(name: str, **fields: Any) -> str:
    """One event as a JSON line ("event" first, so readers can find it in a prefixed line)."""
    if name not in EVENTS:
        raise ValueError(f"unknown event {name!r}: add it to contract.EVENTS")
    return json.dumps({"event": name, **fields}, separators=(", ", ": "), default=str)


def parse_event(line: str) -> dict[str, Any] | None:
    """The event in a log line, or None for any other line (torchrun's, warnings, plain log text)."""
    at = line.find(_EVENT_MARK)
    if at < 0:
        return None
    try:
        obj = json.loads(line[at:].strip())
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and obj.get("event") in EVENTS else None


def parse_events(lines: Any) -> list[dict[str, Any]]:
    """The events among lines (an iterable of str), in order."""
    return [ev for ev in map(parse_event, lines) if ev is not None]
