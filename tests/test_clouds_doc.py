"""docs/clouds.md names exactly the termination taints the operator recognises, and only conditions it reads."""

from __future__ import annotations

import re
from pathlib import Path

from ftjob_operator.planner import preemption

DOC = Path(__file__).resolve().parents[1] / "docs" / "clouds.md"
ROW = re.compile(r"^\| (taint|condition) \| `([^`]+)` \|", re.MULTILINE)
CONDITIONS = {"DisruptionTarget"}  # the pod condition preemption.notice_of reads


def listed() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {"taint": set(), "condition": set()}
    for kind, key in ROW.findall(DOC.read_text()):
        found[kind].add(key)
    return found


def test_the_guide_lists_the_operators_termination_taints_exactly():
    assert listed()["taint"] == set(preemption.TERMINATION_TAINTS)


def test_the_guide_lists_the_pod_conditions_the_operator_reads():
    assert listed()["condition"] == CONDITIONS
    assert "DisruptionTarget" in Path(preemption.__file__).read_text()


def test_every_taint_the_guide_mentions_is_in_its_list():
    """A taint key named anywhere in the prose (the GKE, EKS and AKS sections) is one of the listed ones: the
    backticked keys with a prefix (`domain/name`) that announce a termination or disruption."""
    keys = set(re.findall(r"`([\w.-]+/[\w.-]+)`", DOC.read_text()))
    notices = {
        k for k in keys if re.search(r"termination|disrupt|out-of-service|spot-itn|rebalance|maintenance", k)
    }
    assert notices and notices <= listed()["taint"], notices - listed()["taint"]
