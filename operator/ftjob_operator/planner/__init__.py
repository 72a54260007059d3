"""The pure planner: `plan(observed, now) -> Plan(actions, status)`. No I/O, no clock, no randomness.

Written like JobSet's reconcile (reconcile.py): one Context passed through ordered steps with early returns, each
policy in its own module, imports pointing down:
  observed.py    the observed world: `Observed`, `Nodes`, reading a pod
  context.py     the pass's Context, the actions and `Plan` it produces, `Ending` (how a pass ended)
  progress.py    status.progress: percent, ETA, throughput, goodput, time and steps lost per cause
  lifecycle.py   a usable spec, suspend/resume, an edited template, success, finish and TTL; new generations
  preemption.py  what proves a preemption, counting it, the limit, the termination notice, recovery
  losses.py      the loss classification: which pods were lost, preemption or failure or collateral
  failure.py     the failure budget and backoff; `account_losses` sends each loss to its policy
  children.py    what to create and delete
  summary.py     counts, the Running condition and `status.phase` (decided once, from the Ending); `status_patch`
  reconcile.py   `plan()` and the ordered steps

The handler's side, in order:
1. Observe: the job; every pod labelled ftjob.dev/job-name=<job> (all restart generations, fresh from the API
   when possible); the nodes that exist (or None or []: then "node gone" is never concluded; a node missing
   from a non-empty list is taken as known gone); the Service `<job>-coordinator`;
   whether the Secret `<job>-token` exists; the coordinator's GET /v1/progress when it answers; a fresh random
   token (used only if the Secret must be created).
2. Write `Plan.status` to the status subresource (`status_patch(old, new)` gives a merge patch that also
   removes keys); only after that succeeds emit the Events (so each transition is announced once), then apply
   the Create/Delete/RequestCheckpoint actions in order (Create: 409 means done; Delete: 404 means done, and with
   `uid` a 409 too; RequestCheckpoint: POST /v1/checkpoint on http://<clusterIP>:29401 with the bearer token,
   best effort).
3. Re-run after `requeue_after` seconds when it is set, on every watch event of the job, its children or the
   nodes, and on a timer to poll the progress of a ready coordinator.

Idempotency (an operator restart at any instant creates no duplicates and loses no counter):
- every counter and every "already handled" mark lives in the returned status;
- pod names come from `status.operator.nextPodIndex` and the largest index observed, and a created pod stays in
  `status.operator.pendingPods` (its Create re-issued; a 409 means done) until a list shows it, so a stale list never
  makes a second pod;
- a pod is deleted only when the *persisted* status already accounts for it (retired, of an older restart
  generation, or the job finished), so a crash between delete and status write cannot hide a loss.
"""

from .context import Action, Create, Delete, Ending, Event, InvalidStatus, Plan, RequestCheckpoint
from .failure import backoff_seconds
from .losses import REASON_TRAINER_ERROR
from .observed import Observed, owned_by, pod_generation, pod_name, pod_ready, pod_role
from .preemption import PREEMPTION_COLLATERAL_SECONDS
from .reconcile import plan
from .summary import status_patch

__all__ = [
    "PREEMPTION_COLLATERAL_SECONDS",
    "REASON_TRAINER_ERROR",
    "Action",
    "Create",
    "Delete",
    "Ending",
    "Event",
    "InvalidStatus",
    "Observed",
    "Plan",
    "RequestCheckpoint",
    "backoff_seconds",
    "owned_by",
    "plan",
    "pod_generation",
    "pod_name",
    "pod_ready",
    "pod_role",
    "status_patch",
]
