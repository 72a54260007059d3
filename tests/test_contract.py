"""Pins trainer_image/ftjob_trainer/contract.py: the operator and the trainer both depend on these values."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ftjob_trainer import contract


def test_exit_codes():
    assert (contract.EXIT_DONE, contract.EXIT_ERROR, contract.EXIT_CONFIG_ERROR, contract.EXIT_RESTART) == (
        0,
        1,
        2,
        75,
    )


def test_ports():
    assert (contract.RDZV_PORT, contract.CONTROL_PORT) == (29400, 29401)


def test_node_and_pod_signals():
    assert contract.TAINT_SPOT_INTERRUPTION == "aws-node-termination-handler/spot-itn"
    assert contract.CONDITION_DISRUPTION_TARGET == "DisruptionTarget"


def test_environment_names():
    assert {
        "token": contract.ENV_TOKEN,
        "url": contract.ENV_COORDINATOR_URL,
        "deadline": contract.ENV_SAVE_DEADLINE,
        "log": contract.ENV_TERMINATION_LOG,
        "job": contract.ENV_JOB_NAME,
        "ns": contract.ENV_NAMESPACE,
        "prefix": contract.ENV_FLAG_PREFIX,
    } == {
        "token": "FTJOB_TOKEN",
        "url": "FTJOB_COORDINATOR_URL",
        "deadline": "FTJOB_SAVE_DEADLINE_SECONDS",
        "log": "FTJOB_TERMINATION_LOG",
        "job": "FTJOB_JOB_NAME",
        "ns": "FTJOB_NAMESPACE",
        "prefix": "FTJOB_",
    }
    assert contract.DEFAULT_TERMINATION_LOG == "/dev/termination-log"


def test_http_api():
    assert contract.AUTH_HEADER == "Authorization"
    assert (contract.ROUTE_HEALTH, contract.ROUTE_PROGRESS, contract.ROUTE_CHECKPOINT) == (
        "/healthz",
        "/v1/progress",
        "/v1/checkpoint",
    )
    assert contract.ROUTE_ERROR == "/v1/error"
    assert (contract.ROUTE_WORLD, contract.ROUTE_FENCE) == ("/v1/world", "/v1/fence")
    assert contract.ENV_POD_NAME == "POD_NAME"
    assert (contract.ERRORS_KEPT, contract.ERROR_MESSAGE_MAX) == (16, 1024)


def test_termination_reasons():
    assert (
        contract.REASON_PREEMPTED,
        contract.REASON_PEER,
        contract.REASON_DEADLINE,
        contract.REASON_DONE,
        contract.REASON_ERROR,
    ) == ("preempted", "peer-stopped", "save-skipped-deadline", "done", "error")
    assert (
        contract.REASON_FENCED == "fenced"
    )  # exit 75, like the stops above, but never counted as a preemption


@pytest.mark.slow
def test_contract_imports_no_torch():
    # The operator image has no torch: importing the contract (and the package) must not pull it in.
    code = "import sys, ftjob_trainer.contract; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_time_round_trip_is_utc_with_z():
    from datetime import datetime, timedelta, timezone

    t = datetime(2026, 12, 3, 14, 5, 6, 789000, tzinfo=timezone(timedelta(hours=2)))
    assert contract.format_time(t) == "2026-12-03T12:05:06Z"
    assert contract.format_time_micro(t) == "2026-12-03T12:05:06.789000Z"
    assert contract.parse_time("2026-12-03T12:05:06Z") == datetime(2026, 12, 3, 12, 5, 6, tzinfo=timezone.utc)
    assert contract.parse_time(contract.format_time_micro(t)) == t
    assert contract.parse_time("") is None and contract.parse_time(None) is None
    with pytest.raises(ValueError):
        contract.parse_time("yesterday")


def test_events_round_trip_through_prefixed_lines():
    line = contract.event_line(
        contract.EVENT_CHECKPOINT_COMMITTED, time=1.5, rank=0, step=7, path="/c/step-7"
    )
    assert contract.parse_event(line)["step"] == 7
    assert contract.parse_event("[default0]:" + line) == contract.parse_event(line)
    assert contract.parse_event("2026-12-03 12:00:00,000 rank0 INFO x: step 3 loss 1.0") is None
    assert contract.parse_event('{"event": "no-such-event"}') is None
    assert contract.parse_event('{"event": "exit", truncated') is None
    lines = ["noise", line, contract.event_line(contract.EVENT_EXIT, code=0, reason="done")]
    assert [e["event"] for e in contract.parse_events(lines)] == ["checkpoint_committed", "exit"]
    with pytest.raises(ValueError, match="unknown event"):
        contract.event_line("typo")
    assert len(set(contract.EVENTS)) == len(contract.EVENTS)


def test_checkpoint_kinds_and_tiers():
    assert (contract.KIND_PERIODIC, contract.KIND_REQUEST, contract.KIND_STOP, contract.KIND_FINAL) == (
        "periodic",
        "request",
        "stop",
        "final",
    )
    assert (contract.TIER_DURABLE, contract.TIER_MEMORY, contract.TIER_MIXED) == (
        "durable",
        "memory",
        "mixed",
    )
