"""What rank 0 posts as progress (ftjob_trainer.progress): the step and its time, the recent throughput, the run."""

from __future__ import annotations

from ftjob_trainer import contract
from ftjob_trainer.coordinator import State
from ftjob_trainer.progress import RATE_WINDOW, RunProgress, wire_time

T0 = 1_767_268_800.0  # 2026-01-01T12:00:00Z


def test_a_fresh_run_names_itself_and_its_first_step():
    p = RunProgress(100, tokens_per_step=256, resumed_from_step=0, resumed_step_time=None, started_at=T0)
    doc = p.document(loss=None, world_size=2)
    assert doc["run"] == {
        "startedAt": "2026-01-01T12:00:00.000000Z",
        "resumedFromStep": 0,
        "resumedStepTime": None,
        "firstStepTime": None,
    }
    assert (doc["step"], doc["stepTime"], doc["tokensPerSecond"], doc["totalSteps"]) == (0, None, None, 100)
    p.step_done(1, now=T0 + 5.25)
    p.step_done(2, now=T0 + 5.75)
    doc = p.document(loss=2.5, world_size=2)
    assert doc["run"]["firstStepTime"] == "2026-01-01T12:00:05.250000Z"
    assert (doc["step"], doc["stepTime"]) == (2, "2026-01-01T12:00:05.750000Z")
    assert doc["tokensPerSecond"] == 512.0 and doc["loss"] == 2.5 and doc["worldSize"] == 2


def test_a_resumed_run_says_where_it_resumed_and_when_that_step_was_trained():
    p = RunProgress(100, 256, resumed_from_step=30, resumed_step_time=T0 - 60, started_at=T0)
    doc = p.document(None, 1)
    assert doc["run"]["resumedFromStep"] == 30 and doc["run"]["resumedStepTime"] == wire_time(T0 - 60)
    assert (doc["step"], doc["stepTime"]) == (
        30,
        wire_time(T0 - 60),
    )  # before its first step: the resumed one
    assert contract.parse_time(doc["run"]["startedAt"]).timestamp() == T0


def test_the_throughput_is_recent():
    p = RunProgress(1000, 100, 0, None, T0)
    for step in range(1, 101):  # slow at first, then 10 steps a second
        p.step_done(step, now=T0 + (step if step <= 50 else 50 + (step - 50) * 0.1))
    assert p.tokens_per_second() == 100 * 10.0  # the slow start left the window long ago
    assert len(p.recent) == RATE_WINDOW + 1


def test_the_coordinator_accepts_every_field_of_a_post():
    p = RunProgress(100, 256, 0, None, T0)
    p.step_done(1, now=T0 + 1)
    p.step_done(2, now=T0 + 2)
    state = State()
    got = state.update(p.document(1.5, 2))
    assert got["run"]["firstStepTime"] == wire_time(T0 + 1) and got["tokensPerSecond"] == 256.0
