"""status.progress (planner/progress.py): kept time, lost time and steps per cause, goodput, percent and ETA, from
the trainer's runs as the coordinator reports them. Table-driven: each scenario is the passes an operator makes
(what the coordinator reported, losses counted, the end) and the figures they must end in."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from ftjob_operator import api, planner
from ftjob_operator.planner import Ending, progress, summary
from ftjob_operator.planner.context import Context
from ftjob_trainer.contract import format_time, format_time_micro
from tj_builders import NOW, healthy_status, job, running_observed

TOTAL = 100


def t(seconds: float) -> str:
    return format_time_micro(NOW + timedelta(seconds=seconds))


@dataclass
class See:
    """The coordinator reports `step`, finished at `at`, of the run started at `run` (seconds after NOW)."""

    at: float
    step: int
    run: float
    first: float  # when the run finished its first step
    resumed_from: int = 0
    resumed_at: float | None = None  # when the step it resumed from was trained (from the checkpoint)
    world: int = 2

    def report(self) -> dict:
        return {
            "step": self.step,
            "stepTime": t(self.at),
            "worldSize": self.world,
            "totalSteps": TOTAL,
            "tokensPerSecond": 1000.0,
            "run": {
                "startedAt": t(self.run),
                "resumedFromStep": self.resumed_from,
                "resumedStepTime": None if self.resumed_at is None else t(self.resumed_at),
                "firstStepTime": t(self.first),
            },
        }


@dataclass
class Count:
    at: float
    cause: str  # preemption | failure


@dataclass
class Notice:
    at: float


@dataclass
class End:
    at: float


@dataclass
class Result:
    status: dict
    recoveries: list = field(default_factory=list)

    @property
    def progress(self) -> dict:
        return self.status["progress"]

    def lost(self, cause: str) -> tuple[float, int]:
        lost = self.progress["lost"][cause]
        return lost["seconds"], lost["steps"]


def pass_time(p) -> float:
    return p.at + 1 if isinstance(p, See) else p.at  # a See is planned one second after the step it reports


def run(passes: list, status: dict | None = None) -> Result:
    """Each entry is one pass, in the order of their clocks."""
    status = status or dict(healthy_status(), startTime=format_time(NOW))
    result = Result(status)
    last_report: dict | None = None
    for p in sorted(passes, key=pass_time):
        at = pass_time(p)
        report = p.report() if isinstance(p, See) else last_report
        ctx = Context(
            running_observed(job(status=result.status), progress=report), NOW + timedelta(seconds=at)
        )
        ctx.spec = api.parse_spec(ctx.o.job["spec"])
        summary.record_progress(ctx)
        if isinstance(p, Notice):
            progress.note_notice(ctx)
        if isinstance(p, Count):
            progress.note_interruption(ctx, p.cause)
        progress.account(ctx, Ending.SUCCEEDED if isinstance(p, End) else Ending.FROM_PODS)
        result.status = ctx.st.to_json()
        result.recoveries += [(r.cause, r.seconds) for r in ctx.recoveries]
        last_report = report
    return result


def steady(run_at: float, first: float, steps: range, every: int = 10, **kw) -> list[See]:
    """A run at one step a second whose step n finishes at first + (n - steps.start); seen every `every` steps."""
    return [See(first + (n - steps.start), n, run_at, first, **kw) for n in steps[::every]] + (
        [See(first + (steps[-1] - steps.start), steps[-1], run_at, first, **kw)]
        if (len(steps) - 1) % every
        else []
    )


# Startup: the first run's process starts at +2 and finishes step 1 at +10; one step a second after that.
UNINTERRUPTED = steady(2, 10, range(1, 101)) + [End(110)]
# Notice at +45; the stop save keeps step 40 (trained at +49); the preemption is counted at +50; the replacement run
# resumes from 40 and finishes step 41 at +60.
WITH_NOTICE = (
    steady(2, 10, range(1, 41))
    + [Notice(45), Count(50, "preemption")]
    + steady(52, 60, range(41, 101), resumed_from=40, resumed_at=49)
    + [End(120)]
)
# No notice: step 30 was the last checkpoint (+39); the operator saw step 35 (+44); the loss is counted at +47;
# the next run resumes from 30 and finishes step 31 at +57.
HARD = (
    steady(2, 10, range(1, 36), every=5)
    + [Count(47, "preemption")]
    + steady(50, 57, range(31, 101), resumed_from=30, resumed_at=39)
    + [End(127)]
)
FAILURE = [Count(p.at, "failure") if isinstance(p, Count) else p for p in HARD]
# A run that resumes with no interruption counted (a scale-up, an edited template): goodput pays, no cause does.
UNCHARGED = [p for p in HARD if not isinstance(p, Count)]
# The first resume crashes at step 33 before it saves: the second resumes from 30 too.
TWICE_FROM_ONE_CHECKPOINT = (
    HARD[:-1][: -len(steady(50, 57, range(31, 101), resumed_from=30, resumed_at=39))]
    + steady(50, 57, range(31, 34), every=1, resumed_from=30, resumed_at=39)
    + [Count(62, "failure")]
    + steady(65, 70, range(31, 101), resumed_from=30, resumed_at=39)
    + [End(140)]
)
# The survivor resumes alone (world 1), then the replacement joins: a second resume, same preemption.
SURVIVOR_THEN_FULL = (
    steady(2, 10, range(1, 41))
    + [Count(50, "preemption")]
    + steady(52, 55, range(41, 46), every=5, resumed_from=40, resumed_at=49, world=1)
    + steady(62, 65, range(46, 101), resumed_from=45, resumed_at=59)
    + [End(121)]
)

# The same notice, but the operator last saw step 31 (+40): steps 32..40 were kept all the same.
NOTICE_LAST_STEPS_UNSEEN = (
    steady(2, 10, range(1, 32))
    + [Notice(45), Count(50, "preemption")]
    + steady(52, 60, range(41, 101), resumed_from=40, resumed_at=49)
    + [End(120)]
)
# The operator last saw step 31 (+40); a run it never saw trained 41..45 and stopped at 45 (+59); the next resumes
# from 45 and finishes step 46 at +65. Of the 25 s in between, the 14 steps took 14 s (kept); 11 s were lost.
UNSEEN_RUN = (
    steady(2, 10, range(1, 32))
    + [Count(50, "preemption")]
    + steady(62, 65, range(46, 101), resumed_from=45, resumed_at=59)
    + [End(121)]
)

SCENARIOS = {
    # name: (passes, kept, elapsed, lost preemptions, lost failures, recoveries)
    "uninterrupted": (UNINTERRUPTED, 99, 110, (0, 0), (0, 0), []),
    "preemption with notice": (WITH_NOTICE, 39 + 59, 120, (11, 0), (0, 0), [("preemption", 15)]),
    "notice, last steps unseen": (
        NOTICE_LAST_STEPS_UNSEEN,
        30 + 9 + 59,
        120,
        (11, 0),
        (0, 0),
        [("preemption", 15)],
    ),
    "a run nobody saw": (UNSEEN_RUN, 30 + 14 + 54, 121, (11, 0), (0, 0), [("preemption", 15)]),
    "hard preemption": (HARD, 34 - 5 + 69, 127, (18, 5), (0, 0), [("preemption", 10)]),
    "failure": (FAILURE, 34 - 5 + 69, 127, (0, 0), (18, 5), [("failure", 10)]),
    "resume without a cause": (UNCHARGED, 34 - 5 + 69, 127, (0, 0), (0, 0), []),
    # lost: [39, 57] for the first resume, [57, 70] for the second (not [39, 70] again); steps 5, then 31..33.
    "two resumes from one checkpoint": (
        TWICE_FROM_ONE_CHECKPOINT,
        34 - 5 + (59 - 57) - 2 + 69,
        140,
        (18, 5),
        (13, 3),
        [("preemption", 10), ("failure", 8)],
    ),
    "survivor first, then full size": (
        SURVIVOR_THEN_FULL,
        39 + 4 + 54,
        121,
        (6 + 6, 0),
        (0, 0),
        [("preemption", 5)],
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kept_and_lost_time_and_goodput(name):
    passes, kept, elapsed, lost_pre, lost_fail, recoveries = SCENARIOS[name]
    r = run(passes)
    p = r.progress
    assert (p["keptSeconds"], p["elapsedSeconds"]) == pytest.approx((kept, elapsed)), p
    assert p["goodput"] == pytest.approx(kept / elapsed, abs=1e-4)
    assert r.lost("preemptions") == pytest.approx(lost_pre) and r.lost("failures") == pytest.approx(
        lost_fail
    ), p
    assert r.recoveries == recoveries
    assert (p["percent"], p["etaSeconds"], p["totalSteps"], p["tokensPerSecond"]) == (100.0, 0, TOTAL, 1000.0)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_an_operator_that_sees_every_pass_twice_counts_nothing_twice(name):
    """A restarted operator replans from the persisted status with the same observations: nothing changes but
    what the clock explains."""
    passes = SCENARIOS[name][0]
    once = run(passes)
    doubled = []
    for p in passes:
        doubled += [p, copy.copy(p)] if not isinstance(p, (Count, Notice)) else [p]
    twice = run(doubled)
    assert twice.progress == once.progress and twice.recoveries == once.recoveries


def test_percent_and_eta_follow_the_recent_step_rate():
    r = run(steady(2, 10, range(1, 22)))  # step 21 at +30, one step a second
    p = r.progress
    assert (p["percent"], p["stepsPerSecond"], p["etaSeconds"]) == (21.0, 1.0, 79)
    assert (p["keptSeconds"], p["elapsedSeconds"], p["updatedAt"]) == (
        20,
        31,
        format_time(NOW + timedelta(seconds=31)),
    )
    faster = run([See(34, 31, 2, 10)], status=r.status)  # ten steps in four seconds
    assert (faster.progress["stepsPerSecond"], faster.progress["etaSeconds"]) == (2.5, 28)


def test_nothing_new_writes_nothing():
    r = run(steady(2, 10, range(1, 22)))
    again = run([See(30, 21, 2, 10)], status=r.status)  # the same step, a second later
    assert again.status == r.status


def test_no_figures_before_the_first_step_or_from_a_trainer_that_does_not_report_its_run():
    before = See(10, 0, 2, 10).report()
    before["run"]["firstStepTime"] = None
    ctx = Context(running_observed(job(status=healthy_status()), progress=before), NOW)
    ctx.spec = api.parse_spec(ctx.o.job["spec"])
    progress.account(ctx, Ending.FROM_PODS)
    assert ctx.st.progress is None
    old = running_observed(job(status=healthy_status()), progress={"step": 5, "updatedAt": format_time(NOW)})
    assert "progress" not in planner.plan(old, NOW).status


def test_the_end_gives_the_final_figures_even_without_a_new_step():
    r = run(steady(2, 10, range(1, 101)))
    ended = run([End(150)], status=r.status)
    assert (ended.progress["elapsedSeconds"], ended.progress["etaSeconds"], ended.progress["percent"]) == (
        150,
        0,
        100.0,
    )


def test_success_is_the_whole_run_even_when_the_last_report_was_missed():
    """The coordinator's last report came after the operator's last read (the job ended while the operator
    restarted, or the coordinator was gone by the final pass): the trainer exits 0 only after the last step."""
    r = run(steady(2, 10, range(1, 91)))
    assert (r.status["step"], r.progress["percent"]) == (90, 90.0)
    ctx = Context(running_observed(job(status=r.status)), NOW + timedelta(seconds=120))  # no report this pass
    ctx.spec = api.parse_spec(ctx.o.job["spec"])
    summary.record_progress(ctx)
    progress.account(ctx, Ending.FAILED)
    assert (ctx.st.step, ctx.st.progress.percent) == (90, 90.0)  # a failure says where it stopped
    progress.account(ctx, Ending.SUCCEEDED)
    assert (ctx.st.step, ctx.st.progress.percent, ctx.st.progress.eta_seconds) == (TOTAL, 100.0, 0)


def test_resuming_from_a_suspension_ends_an_open_interruption_and_counts_the_time_suspended():
    r = run([Count(50, "preemption")])
    ctx = Context(running_observed(job(status=r.status)), NOW + timedelta(seconds=200))
    progress.note_resumed_from_suspension(ctx, NOW + timedelta(seconds=80))
    assert ctx.st.operator.interruption is None and ctx.st.operator.suspended_seconds == 120


def test_time_suspended_is_not_elapsed():
    r = run(steady(2, 10, range(1, 22)))  # elapsed 31 at step 21
    st = dict(r.status, operator=dict(r.status["operator"], suspendedSeconds=100.0))
    later = run([See(140, 31, 130, 131, resumed_from=21, resumed_at=30)], status=st)
    assert later.progress["elapsedSeconds"] == 141 - 100


def test_a_notice_long_before_the_loss_does_not_start_the_interruption():
    r = run([Notice(0)] + steady(2, 10, range(1, 41)) + [Count(700, "preemption")])
    assert r.status["operator"]["interruption"]["since"] == format_time(NOW + timedelta(seconds=700))
    r = run([Notice(45), Count(50, "preemption"), Count(51, "failure")])
    interruption = r.status["operator"]["interruption"]
    assert (interruption["cause"], interruption["since"]) == (
        "failure",
        format_time(NOW + timedelta(seconds=45)),
    )
