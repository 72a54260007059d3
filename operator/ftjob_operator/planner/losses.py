"""The loss classification: which pods of the current generation were lost this pass, and what each loss is.

A loss is a preemption when preemption.evidence finds an outside cause; otherwise it is a failure, unless it is
collateral (workers that stop with their coordinator, trainers that error right after a preemption). A trainer
error reported to the coordinator while its pod kept running is a loss too: torchrun restarts the trainer inside
the pod, so the report is the only sign. Only one failure counts per pass: peers that fail with it are its
consequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ftjob_trainer import contract

from .. import conditions as cond
from .. import render
from . import preemption
from .context import Context
from .observed import (
    MAX_MESSAGE,
    Nodes,
    fatal_waiting_reason,
    loss_of,
    pod_name,
    pod_role,
    terminated,
    termination_message,
    waiting,
)

# Workers that stop within this long after the coordinator was lost are its collateral, not failures.
COORDINATOR_COLLATERAL_SECONDS = 120
# lastFailure.reason of a failure the trainer reported (coordinator /v1/error) while its pod kept running.
REASON_TRAINER_ERROR = "TrainerError"


@dataclass(frozen=True)
class Loss:
    pod: str
    role: str
    preemption: bool
    why: str
    exit_code: int | None = None  # the container's (torchrun's, for a worker)
    message: str = ""
    trainer_exit_code: int | None = None  # the trainer's own: its termination message or its error report


def classify(pod: dict[str, Any], nodes: Nodes, noticed: set[str]) -> Loss:
    """Preemption (never uses the failure budget) or failure, with the evidence in words."""
    name, role = pod_name(pod), pod_role(pod)
    t = terminated(pod) or {}
    exit_code = t.get("exitCode")
    said = termination_message(pod)
    trainer_msg = said.get("message") or ""
    trainer_exit = said.get("exitCode") if isinstance(said.get("exitCode"), int) else None
    why = preemption.evidence(pod, nodes, noticed)
    if why:
        return Loss(name, role, True, why, exit_code, trainer_msg)
    reason = fatal_waiting_reason(pod)
    if reason:
        return Loss(name, role, False, reason, None, (waiting(pod).get("message") or "")[:MAX_MESSAGE])
    why = t.get("reason") or "Error"
    message = (trainer_msg or t.get("message") or "")[:MAX_MESSAGE]
    return Loss(name, role, False, why, exit_code, message, trainer_exit)


def new_losses(ctx: Context) -> list[Loss]:
    """Pods of the current generation lost since the last pass, by pod index, then known pods that vanished."""
    retired = set(ctx.st.operator.retired_pods)
    noticed = set(ctx.st.operator.noticed_pods)
    losses = [
        classify(pod, ctx.nodes, noticed)
        for pod in ctx.current
        if pod_name(pod) not in retired and loss_of(pod, ctx.nodes) is not None
    ]
    for name in ctx.st.operator.known_pods:
        if name not in ctx.by_name and name not in retired:
            role = render.ROLE_WORKER if ctx.is_worker_name(name) else render.ROLE_COORDINATOR
            losses.append(Loss(name, role, True, preemption.VANISHED))
    return losses


def retire(ctx: Context, losses: list[Loss]) -> Loss | None:
    """Retire each loss (never counted twice): count the preemptions, set aside the coordinator's collateral,
    and return the one failure of this pass (the first; the others are announced as its consequence)."""
    coordinator_lost_at = contract.parse_time(ctx.st.operator.coordinator_lost_at)
    # Before the loop: losses go by pod index, and a replaced coordinator's index is above the workers', yet
    # workers lost in the same pass are its collateral either way.
    if any(loss.role == render.ROLE_COORDINATOR for loss in losses):
        ctx.st.operator.coordinator_lost_at = ctx.now_s
        coordinator_lost_at = ctx.now
    failure: Loss | None = None
    for loss in losses:
        ctx.st.operator.retired_pods.append(loss.pod)
        if loss.preemption:
            preemption.count(ctx, loss.pod, loss.role, loss.why)
        elif loss.role == render.ROLE_WORKER and coordinator_collateral(ctx, coordinator_lost_at):
            ctx.event(
                cond.NORMAL,
                cond.REASON_LOST_WITH_COORDINATOR,
                f"worker {loss.pod} stopped ({loss.why}, exit code {loss.exit_code}) after the coordinator was "
                "lost; replacing it",
            )
        elif failure is None:
            failure = loss
        else:
            ctx.event(cond.NORMAL, cond.REASON_WORKER_FAILED, f"{loss.pod} stopped along with {failure.pod}")
    return failure


def coordinator_collateral(ctx: Context, lost_at: datetime | None) -> bool:
    """Workers that stop while the coordinator is down, or soon after it came back, are not to blame."""
    if lost_at is None:
        return False
    backoff = contract.parse_time(ctx.st.operator.backoff_until)
    recovering = backoff is not None and ctx.now < backoff + timedelta(seconds=COORDINATOR_COLLATERAL_SECONDS)
    return recovering or (ctx.now - lost_at).total_seconds() <= COORDINATOR_COLLATERAL_SECONDS


def trainer_error(ctx: Context, failure: Loss | None) -> Loss | None:
    """The first new error report (coordinator progress `errors`) of a live worker of this generation, as a
    failure. torchrun restarts a crashed trainer inside its pod (its restart budget stays huge for exit 75), so
    the pod never fails: this report is the only sign. Every report seen is marked handled, counted or not."""
    progress = ctx.o.progress or {}
    reports = progress.get("errors")
    if not isinstance(reports, list):
        reports = [progress["lastError"]] if isinstance(progress.get("lastError"), dict) else []
    fresh = [
        r
        for r in reports
        if isinstance(r, dict) and isinstance(r.get("id"), int) and r["id"] > ctx.st.operator.handled_error_id
    ]
    if not fresh:
        return None
    ctx.st.operator.handled_error_id = max(r["id"] for r in fresh)
    # Reports of pods already counted, retired, or of an older generation (the restart answered them) are done.
    live = {pod_name(p) for p in ctx.alive(render.ROLE_WORKER)} - set(ctx.st.operator.retired_pods)
    mine = [r for r in fresh if r.get("pod") in live]
    if not mine:
        return None
    r = mine[0]  # the oldest: peers whose collectives broke with it report after it
    where = f"rank {r.get('rank')}" + (f" after step {r['step']}" if isinstance(r.get("step"), int) else "")
    message = f"{where}: {r.get('message') or 'no message'}"[:MAX_MESSAGE]
    exit_code = r.get("exitCode") if isinstance(r.get("exitCode"), int) else None
    said = f"{r['pod']} reported an error (exit code {exit_code}, {message})"
    if failure is not None:
        ctx.event(cond.NORMAL, cond.REASON_WORKER_FAILED, f"{said} along with {failure.pod}")
        return None
    if preemption.soon_after_a_preemption(ctx):
        ctx.event(cond.NORMAL, cond.REASON_PREEMPTED, f"{said} after a preemption; not counted as a failure")
        return None
    if coordinator_collateral(ctx, contract.parse_time(ctx.st.operator.coordinator_lost_at)):
        ctx.event(cond.NORMAL, cond.REASON_LOST_WITH_COORDINATOR, f"{said} after the coordinator was lost")
        return None
    return Loss(r["pod"], render.ROLE_WORKER, False, REASON_TRAINER_ERROR, exit_code, message, exit_code)
