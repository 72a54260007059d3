"""planner/config_error.py: the trainer's exit code 2 (contract.EXIT_CONFIG_ERROR) fails the job at once, with
the trainer's message in the Failed condition and no restart; any other failure still restarts after the
backoff.

One row per way the planner can learn a failure: a container's exit code, the trainer's termination message (a
worker's container is torchrun, whose own code is 1), a trainer's error report to the coordinator while its
pod keeps running (torchrun restarts the trainer in place), and the coordinator's own exit."""

from __future__ import annotations

import json

import pytest
from ftjob_operator import conditions as cond
from ftjob_operator.planner import plan
from ftjob_trainer import contract
from ftjob_trainer.coordinator import State
from tj_builders import NOW, at, condition, started

CONFIG_MESSAGE = "configuration error: --model=hf:/models/none: give a transformers model directory"


def worker_exit(code: int, trainer_code: int | None = None):
    def lose(store) -> str:
        victim = store.names("worker")[0]
        message = CONFIG_MESSAGE  # plain text, as a program other than ftjob's trainer leaves it
        if trainer_code is not None:
            message = json.dumps({"reason": "error", "exitCode": trainer_code, "message": CONFIG_MESSAGE})
        store.exit(victim, code, "Error", message)
        return victim

    return lose


def coordinator_exit(code: int):
    def lose(store) -> str:
        victim = store.names("coordinator")[0]
        store.exit(victim, code, "Error", CONFIG_MESSAGE)
        return victim

    return lose


def error_report(code: int):
    def lose(store) -> str:
        victim = store.names("worker")[1]
        state = State()
        state.report_error(
            {"pod": victim, "rank": 1, "exitCode": code, "message": CONFIG_MESSAGE, "step": None}
        )
        store.progress = state.snapshot()
        return victim

    return lose


# case: (how the failure happens, whether it is a configuration error)
ROWS = {
    "worker container exits 2": (worker_exit(2), True),
    "torchrun exits 1, the trainer's termination message says 2": (worker_exit(1, trainer_code=2), True),
    "the trainer reports exit 2 to the coordinator (pod still running)": (error_report(2), True),
    "coordinator exits 2": (coordinator_exit(2), True),
    "worker container exits 1": (worker_exit(1), False),
    "torchrun exits 1, the trainer's termination message says 1": (worker_exit(1, trainer_code=1), False),
    "the trainer reports exit 1 to the coordinator": (error_report(1), False),
    "coordinator exits 1": (coordinator_exit(1), False),
}


@pytest.mark.parametrize("case", ROWS)
def test_exit_code_2_fails_the_job_without_retries(case):
    lose, config_error = ROWS[case]
    store = started(failurePolicy={"maxFailures": 5})
    victim = lose(store)
    p = plan(store.observe(), NOW)
    st = p.status
    assert st["failures"] == 1 and st["lastFailure"]["pod"] == victim and st["preemptions"] == 0
    if not config_error:
        assert st["phase"] == "Restarting" and st["operator"].get("backoffUntil")
        return
    assert st["phase"] == "Failed" and st["restarts"] == 0
    failed = condition(st, "Failed")
    assert failed["status"] == "True" and failed["reason"] == cond.REASON_CONFIG_ERROR
    assert victim in failed["message"] and CONFIG_MESSAGE in failed["message"]
    assert f"exit code {contract.EXIT_CONFIG_ERROR} means the configuration is wrong" in failed["message"]
    assert not st["operator"].get("backoffUntil")
    store.apply(p)
    later = plan(store.observe(), at(600))  # long after any backoff: still nothing created
    assert later.status["phase"] == "Failed" and later.status["restarts"] == 0
    assert not [a for a in later.actions if type(a).__name__ == "Create"]
