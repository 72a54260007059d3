"""The progress summary: `status.progress` (percent, ETA, throughput, goodput, and what preemptions and failures
cost) from what the trainer reports through the coordinator (the step and when it finished, the run: contract.py)
and what the operator observes (the start, suspensions, the losses it counts).

A run is one rank-0 trainer process, named by its start time: torchrun restarts every worker on a membership
change, so each resume is a new run. For every run the operator accounts its training time once:
- keptSeconds grows by the time between the steps it sees of one run (from the run's first step on);
- a new run after an earlier one is a resume. The previous run's work after the step the resume loaded is thrown
  away: its time leaves keptSeconds and its steps count as trained twice. The resume's lost time runs from the last
  kept step (the loaded one, or the previous run's first step if that is later: the gap before it was counted then)
  to the resume's first step. Steps between the previous run's newest one seen and the loaded one were kept (at most
  the time they take at the recent rate: the rest was a restart of a run too short to be seen, and is lost). Every
  second from the last step seen to the resume's first step is thus kept or lost. The lost time is charged to the
  open interruption (`status.operator.interruption`, set when a preemption or failure is counted) until the job
  trains at its full size again in a pass that ends normally; resumes without one (scale-up, suspend, an edited
  template) lower goodput under no cause.
- goodput = keptSeconds / elapsedSeconds, elapsed from status.startTime, less the time suspended.

Restart-safe: the accumulators and the run last accounted for live in the status, so a pass that sees nothing new
changes nothing, and an operator restart neither resets nor counts twice. The figures change only when a new step
is seen and when the job ends (no status write per second).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ftjob_trainer import contract

from .. import api
from .context import Context, Ending, Recovery

PREEMPTION, FAILURE = "preemption", "failure"
# A termination notice older than this when the loss comes did not announce it.
NOTICE_MEMORY_SECONDS = 600
_NOT_ACCOUNTED = (Ending.DELETING, Ending.FINISHED, Ending.INVALID)


# --- what the other policies tell it ---------------------------------------------------------------------------
def note_notice(ctx: Context) -> None:
    """A termination notice: an interruption that follows soon starts here."""
    if ctx.st.operator.noticed_at is None:
        ctx.st.operator.noticed_at = ctx.now_s


def note_interruption(ctx: Context, cause: str) -> None:
    """A counted preemption or failure: the resumes that follow are charged to it. Losses counted before the job
    trained again belong to the same interruption (its start stays; the newest cause is charged)."""
    book = ctx.st.operator
    noticed = contract.parse_time(book.noticed_at)
    since = ctx.now_s
    if noticed is not None and timedelta(0) <= ctx.now - noticed <= timedelta(seconds=NOTICE_MEMORY_SECONDS):
        since = book.noticed_at
    book.noticed_at = None
    if book.interruption is not None and not book.interruption.resumed:
        since = min(since, book.interruption.since, key=contract.parse_time)
    book.interruption = api.InterruptionStatus(cause=cause, since=since)


def note_resumed_from_suspension(ctx: Context, suspended_at: datetime | None) -> None:
    """The time suspended is not elapsed time; the restart that follows is the suspension's, not an earlier
    interruption's (its gap holds the time suspended)."""
    if suspended_at is not None:
        ctx.st.operator.suspended_seconds += max(0.0, (ctx.now - suspended_at).total_seconds())
    ctx.st.operator.interruption = None


# --- the accounting, at the end of every pass ------------------------------------------------------------------
def account(ctx: Context, ending: Ending) -> None:
    """Account what the coordinator reported this pass; refresh status.progress when there was something new, or
    when the job ends."""
    if ending in _NOT_ACCOUNTED or ctx.spec is None:
        return
    report = ctx.o.progress or {}
    progress = ctx.st.progress or api.ProgressStatus()
    seen = _account_run(ctx, progress, report)
    if seen:
        _close_interruption_at_full_size(ctx, report, ending)
    ends = ending in (Ending.SUCCEEDED, Ending.FAILED)
    total = report.get("totalSteps") if isinstance(report.get("totalSteps"), int) else ctx.spec.trainer.steps
    if ending is Ending.SUCCEEDED and total:
        # The trainer exits 0 only after the run's last step: the whole run is done even when the coordinator's
        # last report came after this operator's last read (it is gone by now, or the operator was restarting).
        ctx.st.step = max(ctx.st.step or 0, total)
    if seen or ends:
        _refresh(ctx, progress, report, ends)
        ctx.st.progress = progress


def _account_run(ctx: Context, progress: api.ProgressStatus, report: dict[str, Any]) -> bool:
    """Add the reported run's new training time; a new run is a resume. True when a new step or run was seen."""
    run = report.get("run") if isinstance(report.get("run"), dict) else {}
    step, step_time = report.get("step"), _time(report.get("stepTime"))
    first, started = _time(run.get("firstStepTime")), run.get("startedAt")
    if not isinstance(step, int) or step_time is None or first is None or not isinstance(started, str):
        return False  # this run has not finished a step yet (or an older trainer that does not say)
    book = ctx.st.operator
    prev = book.run
    if prev is not None and prev.started_at == started:
        if step <= prev.step:
            return False
        seconds = (step_time - contract.parse_time(prev.step_time)).total_seconds()
        if seconds > 0:
            progress.kept_seconds += seconds
            progress.steps_per_second = round((step - prev.step) / seconds, 4)
    else:
        resumed_from = run.get("resumedFromStep") if isinstance(run.get("resumedFromStep"), int) else 0
        if prev is not None:
            _resume(ctx, progress, prev, resumed_from, _time(run.get("resumedStepTime")), first)
        seconds = (step_time - first).total_seconds()
        progress.kept_seconds += max(0.0, seconds)
        if seconds > 0 and step > resumed_from + 1:
            progress.steps_per_second = round((step - resumed_from - 1) / seconds, 4)
        prev = api.TrainerRunStatus(
            started_at=started,
            resumed_from_step=resumed_from,
            first_step_time=run["firstStepTime"],
            step=step,
            step_time=report["stepTime"],
        )
    book.run = prev.model_copy(update={"step": step, "step_time": report["stepTime"]})
    progress.kept_seconds = round(progress.kept_seconds, 3)
    return True


def _resume(
    ctx: Context,
    progress: api.ProgressStatus,
    prev: api.TrainerRunStatus,
    resumed_from: int,
    resumed_step_time: datetime | None,
    first: datetime,
) -> None:
    """A new run after `prev`, the run last seen. Every second from prev's newest step seen to the new run's first
    step is kept or lost: the steps up to the loaded one were kept (trained by prev after it was last seen, or by a
    run too short to be seen), prev's work after the loaded step is thrown away, the rest is lost to the open
    interruption's cause. Its first resume is a recovery (the metrics' histogram)."""
    prev_first, prev_time = contract.parse_time(prev.first_step_time), contract.parse_time(prev.step_time)
    rate = progress.steps_per_second
    thrown_steps = 0
    if resumed_from >= prev.step:
        kept_at = resumed_step_time or prev_time
        gained = max(0.0, (kept_at - prev_time).total_seconds())
        if rate:  # at most the time those steps take at the recent rate: the rest was a restart nobody saw
            gained = min(gained, (resumed_from - prev.step) / rate)
        progress.kept_seconds += gained
        lost_seconds = max(0.0, (first - prev_time).total_seconds() - gained)
    else:
        thrown_steps = prev.step - max(resumed_from, prev.resumed_from_step)
        kept_at = resumed_step_time
        if (
            kept_at is None
        ):  # an older checkpoint that does not say: rewind prev's newest step at the recent rate
            kept_at = prev_time - timedelta(seconds=thrown_steps / rate if rate else 0.0)
        kept_at = max(
            kept_at, prev_first
        )  # before prev's first step: its own resume counted that gap already
        thrown = max(0.0, (prev_time - kept_at).total_seconds())
        progress.kept_seconds = max(0.0, progress.kept_seconds - thrown)
        lost_seconds = max(0.0, (first - kept_at).total_seconds())
    interruption = ctx.st.operator.interruption
    if interruption is None:
        return  # a scale-up, a suspension, an edited template: goodput counts it, no cause does
    lost = progress.lost.preemptions if interruption.cause == PREEMPTION else progress.lost.failures
    lost.seconds = round(lost.seconds + lost_seconds, 3)
    lost.steps += thrown_steps
    if not interruption.resumed:
        since = contract.parse_time(interruption.since)
        ctx.recoveries.append(Recovery(interruption.cause, max(0.0, (first - since).total_seconds())))
        interruption.resumed = True


def _close_interruption_at_full_size(ctx: Context, report: dict[str, Any], ending: Ending) -> None:
    """Back at full size after a resume, in a pass that ends normally (not one that starts a restart): later
    resumes are no longer this interruption's."""
    interruption = ctx.st.operator.interruption
    full = ctx.spec.workers.desired * ctx.spec.processes_per_worker
    if (
        interruption
        and interruption.resumed
        and ending is Ending.FROM_PODS
        and report.get("worldSize") == full
    ):
        ctx.st.operator.interruption = None


def _refresh(ctx: Context, progress: api.ProgressStatus, report: dict[str, Any], ends: bool) -> None:
    """The figures users read, as of now."""
    total = report.get("totalSteps") if isinstance(report.get("totalSteps"), int) else None
    total = total or ctx.spec.trainer.steps
    step = ctx.st.step
    progress.total_steps = total
    if total and step is not None:
        progress.percent = round(min(100.0, 100.0 * step / total), 1)
        rate = progress.steps_per_second
        progress.eta_seconds = (
            0 if ends or step >= total else round((total - step) / rate) if rate else progress.eta_seconds
        )
    tokens = report.get("tokensPerSecond")
    if isinstance(tokens, (int, float)) and not isinstance(tokens, bool):
        progress.tokens_per_second = round(float(tokens), 1)
    started = contract.parse_time(ctx.st.start_time)
    if started is not None:
        elapsed = (ctx.now - started).total_seconds() - ctx.st.operator.suspended_seconds
        progress.elapsed_seconds = round(max(0.0, elapsed), 3)
        if progress.elapsed_seconds > 0:
            progress.goodput = round(min(1.0, progress.kept_seconds / progress.elapsed_seconds), 4)
    progress.updated_at = ctx.now_s


def _time(value: Any) -> datetime | None:
    try:
        return contract.parse_time(value) if isinstance(value, str) else None
    except ValueError:
        return None
