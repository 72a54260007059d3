"""The failure policy: a failure spends the budget (spec.failurePolicy.maxFailures), then the job restarts after
an exponential backoff: the whole job as a new restart generation, or only a failed coordinator.

The step `account_losses` sends every new loss to its policy: preemptions to preemption.py, failures here.
"""

from __future__ import annotations

import hashlib
import math
from datetime import timedelta

from ftjob_trainer import contract

from .. import api, render
from .. import conditions as cond
from . import config_error, losses, preemption, progress
from .context import FOLLOW_UP_SECONDS, Context, Ending
from .lifecycle import finish, start_new_generation
from .losses import Loss
from .observed import pod_role


def backoff_seconds(policy: api.FailurePolicySpec, uid: str, failures: int) -> float:
    """Exponential backoff with jitter; the jitter is a hash of (uid, failures), so the planner stays pure."""
    delay = min(float(policy.backoff_max_seconds), policy.backoff_base_seconds * 2.0 ** max(0, failures - 1))
    u = int(hashlib.sha256(f"{uid}/{failures}".encode()).hexdigest()[:8], 16) / 2**32
    return delay * (1.0 - policy.jitter * u)


# step: lost pods -> preemption policy or failure policy
def account_losses(ctx: Context) -> Ending | None:
    """Count every newly lost pod once (and every new trainer error report). An Ending when the pass ends here
    (the job failed, or a restart began)."""
    lost = losses.new_losses(ctx)
    if not lost:
        error = losses.trainer_error(ctx, None)
        return fail_or_restart(ctx, error) if error else None
    failure = losses.retire(ctx, lost)
    limited = preemption.enforce_limit(ctx)
    if limited:
        return limited
    error = losses.trainer_error(ctx, failure)
    if failure is None and error is None:
        return None
    return fail_or_restart(ctx, failure or error)


def fail_or_restart(ctx: Context, loss: Loss) -> Ending:
    """Count the failure; fail the job when the budget is spent, else restart after the backoff."""
    policy = ctx.spec.failure_policy
    ctx.st.failures += 1
    progress.note_interruption(ctx, progress.FAILURE)
    ctx.st.last_failure = api.FailureStatus(
        pod=loss.pod,
        exit_code=loss.exit_code,
        reason=loss.why,
        message=loss.message or None,
        time=ctx.now_s,
    )
    described = f"{loss.role} {loss.pod} failed: {loss.why}, exit code {loss.exit_code}" + (
        f", message: {loss.message}" if loss.message else ""
    )
    fatal = config_error.fail_on_config_error(ctx, loss, described)
    if fatal:
        return fatal
    if ctx.st.failures > policy.max_failures:
        return finish(
            ctx,
            Ending.FAILED,
            cond.REASON_BACKOFF_LIMIT,
            f"failure {ctx.st.failures} exceeds spec.failurePolicy.maxFailures={policy.max_failures}: {described}",
        )
    reason = cond.REASON_WORKER_FAILED if loss.role == render.ROLE_WORKER else cond.REASON_COORDINATOR_FAILED
    ctx.event(cond.WARNING, reason, f"{described} ({ctx.st.failures}/{policy.max_failures} failures)")
    delay = math.ceil(backoff_seconds(policy, ctx.ref.uid, ctx.st.failures))
    ctx.st.operator.backoff_until = contract.format_time(ctx.now + timedelta(seconds=delay))
    ctx.requeue_in(FOLLOW_UP_SECONDS)
    if loss.role == render.ROLE_COORDINATOR:
        # Recreate only the coordinator, after the backoff (a crash-looping one must not burn the budget in
        # seconds); the workers rejoin it and resume from the last committed checkpoint.
        ctx.condition(
            cond.RESTARTING,
            cond.TRUE,
            cond.REASON_RESTART_BACKOFF,
            f"recreating the coordinator after {described}",
        )
        ctx.clear(cond.RUNNING, cond.REASON_RESTART_BACKOFF, "the coordinator failed")
        ctx.event(cond.NORMAL, cond.REASON_RESTART_BACKOFF, f"recreating the coordinator in {delay}s")
        return Ending.RESTARTING
    # Restart the whole job: the current pods become an older generation (deleted next pass).
    start_new_generation(ctx)
    ctx.st.restarts += 1
    ctx.condition(
        cond.RESTARTING,
        cond.TRUE,
        cond.REASON_RESTART_BACKOFF,
        f"restart {ctx.st.restarts} after {described}",
    )
    ctx.clear(cond.RUNNING, cond.REASON_RESTART_BACKOFF, "restarting after a failure")
    ctx.event(cond.NORMAL, cond.REASON_RESTART_BACKOFF, f"restarting in {delay}s (restart {ctx.st.restarts})")
    return Ending.RESTARTING


# step: wait out the backoff, and for the old generation to leave the rendezvous
def wait_out_backoff(ctx: Context) -> Ending | None:
    until = contract.parse_time(ctx.st.operator.backoff_until)
    if until is not None and ctx.now < until:
        ctx.requeue_in((until - ctx.now).total_seconds())
        return Ending.FROM_PODS
    old_workers = [p for p in ctx.old if pod_role(p) == render.ROLE_WORKER]
    if old_workers and not ctx.current:
        # The old generation may still be saving its checkpoint on SIGTERM: the new one must load that one.
        # (Its --rdzv-id differs, so the two never meet in a rendezvous round either way.)
        ctx.requeue_in(FOLLOW_UP_SECONDS)
        return Ending.FROM_PODS
    ctx.st.operator.backoff_until = None
    return None
