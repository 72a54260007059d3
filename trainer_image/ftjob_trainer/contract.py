"""The contract between the operator and the trainer: exit codes, ports, environment, the coordinator's HTTP API.

Torch-free on purpose: the operator imports this module and its image has no torch. Change it only together
with both sides; tests/test_contract.py pins the values.
"""

from __future__ import annotations

from datetime import datetime, timezone

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
# Every trainer flag --some-flag is also read from FTJOB_SOME_FLAG (flag wins).
ENV_FLAG_PREFIX = "FTJOB_"

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
# Progress document keys (GET /v1/progress):
#   step: int | None, loss: float | None, worldSize: int | None, updatedAt: RFC 3339 str | None,
#   lastCheckpoint: {"step": int, "path": str, "time": RFC 3339 str} | None,
#   checkpointRequest: {"id": int, "reason": str} | None   (the newest request; rank 0 compares ids)
#   handledRequestId: int   (the newest request id a committed checkpoint answered)
#   lastError: {"id", "pod", "rank", "exitCode", "message", "step", "time"} | None   (the newest error report)
#   errors: [the same, oldest first]   (the newest ERRORS_KEPT reports: the first one names the root cause, later
#           ones are often peers whose collectives failed with it)
#   Error ids increase, also across coordinator restarts (milliseconds since the epoch, bumped past the last id),
#   so the operator keeps only the newest id it handled (status.handledErrorId).
ERRORS_KEPT = 16
ERROR_MESSAGE_MAX = 1024  # characters of an error message the coordinator keeps (the end: where the error is)

# --- Termination message (JSON written to the termination log before exit) -------------------------------------
# {"step": int, "checkpoint": str | None, "reason": str, "exitCode": int, "message": str}
REASON_PREEMPTED = "preempted"  # this process got SIGTERM (or another stop signal)
REASON_PEER = "peer-stopped"  # another rank was signalled; this one stopped (and saved) with it
REASON_DEADLINE = "save-skipped-deadline"  # a save could not fit the deadline; the last committed one is kept
REASON_DONE = "done"
REASON_ERROR = "error"


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
