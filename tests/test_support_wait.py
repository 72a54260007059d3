"""tests/support/wait.py: the polling helper every test tier uses."""

from __future__ import annotations

import pytest
from support.wait import wait_until


def test_returns_the_first_truthy_value():
    answers = iter([None, 0, "", {"phase": "Running"}])
    assert wait_until(lambda: next(answers), 10, "a phase", interval=0) == {"phase": "Running"}


def test_timeout_names_what_it_waited_for_and_what_it_saw():
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: None, 0, "the job to finish", interval=0, diagnose=lambda: "status: Pending")
    assert str(failed.value) == "timed out after 0s waiting for the job to finish\nstatus: Pending"


def test_a_failing_diagnosis_does_not_hide_the_timeout():
    def broken() -> str:
        raise OSError("log gone")

    with pytest.raises(AssertionError, match="timed out after 0s waiting for x\n.*log gone"):
        wait_until(lambda: None, 0, "x", interval=0, diagnose=broken)


def test_give_up_fails_at_once_with_its_reason():
    looks = []

    def predicate():
        looks.append(1)
        return None

    with pytest.raises(AssertionError) as failed:
        wait_until(predicate, 3600, "the report", give_up=lambda: "the process exited with 1")
    assert str(failed.value) == "gave up waiting for the report: the process exited with 1"
    assert len(looks) == 2  # one round, then one last look after give_up said so


def test_give_up_still_returns_a_value_that_arrived_at_the_end():
    answers = iter([None, "written"])
    assert wait_until(lambda: next(answers), 3600, "the file", give_up=lambda: "exited") == "written"
