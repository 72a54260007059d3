"""`plan()` and the reconcile it runs: one Context through ordered steps with early returns (JobSet's
`reconcile()`). Each step lives with its policy; the first that ends the pass says how (an Ending), and
summary.conclude writes the counts and the phase from that.
"""

from __future__ import annotations

from datetime import datetime

from .. import api, render
from . import children, failure, lifecycle, preemption, summary
from .context import Context, Ending, Plan
from .observed import Observed, pod_ready


def plan(observed: Observed, now: datetime) -> Plan:
    """The actions that move the job toward its spec, and its new status. Same inputs, same plan.
    Raises InvalidStatus (and plans nothing) when the job's status cannot be read."""
    if now.tzinfo is None:
        raise ValueError("plan() needs an aware datetime (datetime.now(timezone.utc))")
    ctx = Context(observed, now)
    summary.conclude(ctx, reconcile(ctx))
    return ctx.plan()


def reconcile(ctx: Context) -> Ending:
    """One pass, in order. Returns how it ended."""
    if ctx.meta.get("deletionTimestamp"):
        return Ending.DELETING  # garbage collection removes the children
    if ctx.prev.phase in api.FINISHED_PHASES:
        return lifecycle.clean_up_finished(ctx)
    ending = lifecycle.validate(ctx)  # sets ctx.spec
    if ending is not None:
        return ending
    summary.record_progress(ctx)
    children.delete_old_generation(ctx)
    children.forget_observed_pending(ctx)
    if ctx.spec.suspend:
        return lifecycle.suspend(ctx)
    lifecycle.resume_if_suspended(ctx)
    for step in (
        lifecycle.restart_on_template_change,
        lifecycle.succeed,
        failure.account_losses,
        failure.wait_out_backoff,
    ):
        ending = step(ctx)
        if ending is not None:
            return ending
    request_checkpoints(ctx)
    children.ensure(ctx)
    return Ending.FROM_PODS


# step: ask the coordinator for a checkpoint (termination notices, the user's annotation)
def request_checkpoints(ctx: Context) -> None:
    coordinator_ready = any(pod_ready(p) for p in ctx.alive(render.ROLE_COORDINATOR))
    if not coordinator_ready or not ctx.alive(render.ROLE_WORKER):
        return  # nothing can save now; a notice is acted on again on the next pass
    preemption.checkpoint_on_notice(ctx)
    lifecycle.checkpoint_on_annotation(ctx)
