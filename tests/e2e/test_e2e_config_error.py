"""A trainer that exits 2 (contract.EXIT_CONFIG_ERROR: its configuration is wrong) ends the job Failed after one
attempt, with the trainer's message in the Failed condition (issue 14). The CRD refuses an unknown preset at the
door (test_operator_admission.py), so the bad model here is an hf: path that holds no model: only the trainer,
inside the pod, can tell."""

from __future__ import annotations

import pytest
from e2e_lib import apply, diagnose, tiny_job, wait_finished

pytestmark = pytest.mark.slow


def test_exit_code_2_fails_the_job_after_one_attempt(session):
    name = "bad-model"
    apply(session, tiny_job(name, workers=(1, 1), trainer={"model": "hf:/no/such/model"}))
    st = wait_finished(session, name, 240)
    failed = next((c for c in st.get("conditions", []) if c["type"] == "Failed"), None)
    assert st["phase"] == "Failed" and failed is not None, diagnose(session, name)
    assert failed["reason"] == "TrainerConfigError", failed
    assert "hf:/no/such/model" in failed["message"] and "exit code 2" in failed["message"], failed
    assert (st["failures"], st["restarts"], st["preemptions"]) == (1, 0, 0), st
