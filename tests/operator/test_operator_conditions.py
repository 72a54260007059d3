"""conditions.set_condition: one function sets a condition, keeping lastTransitionTime unless the status flips."""

from __future__ import annotations

import pytest
from ftjob_operator import conditions as cond


def test_set_condition_keeps_transition_time_when_only_reason_changes():
    c1 = cond.set_condition([], "Running", "True", "Training", "1/2", now="T1", generation=1)
    c2 = cond.set_condition(c1, "Running", "True", "Training", "2/2", now="T2", generation=2)
    assert (
        c2[0]["lastTransitionTime"] == "T1" and c2[0]["message"] == "2/2" and c2[0]["observedGeneration"] == 2
    )
    c3 = cond.set_condition(c2, "Running", "False", "WaitingForWorkers", "", now="T3", generation=2)
    assert c3[0]["lastTransitionTime"] == "T3"
    with pytest.raises(ValueError, match="True, False or Unknown"):
        cond.set_condition(c3, "Running", "yes", "R", "", now="T4", generation=None)
