"""Invalid TrainingJobs are refused by plain `kubectl apply` with a message that says what to fix, and nothing is
created. Only the API server and the CRD take part (no operator), as on a real cluster."""

from __future__ import annotations

import copy

import pytest
import yaml
from e2e_lib import example_docs
from ftjob_local.session import Session
from support.cluster import local_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def crd_only(tmp_path_factory):
    with local_cluster(tmp_path_factory.mktemp("crd") / "state", nodes=1, spot_nodes=0) as cluster:
        session = Session(cluster)
        session.install_crd()
        yield session


def job(name: str = "bad-job", **spec_changes) -> dict:
    doc = copy.deepcopy(next(d for d in example_docs() if d["kind"] == "TrainingJob"))
    doc["metadata"]["name"] = name
    for dotted, value in spec_changes.items():
        *parents, leaf = dotted.split("__")
        node = doc["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return doc


CASES = {
    "min above max": (job(workers={"min": 3, "max": 2}), ["spec.workers.min must be <= spec.workers.max"]),
    "negative steps": (job(trainer__steps=-5), ["spec.trainer.steps", "greater than or equal to 1"]),
    "negative grace period": (
        job(preemption__gracePeriodSeconds=-1),
        ["spec.preemption.gracePeriodSeconds", "greater than or equal to 10"],
    ),
    "negative failure budget": (
        job(failurePolicy__maxFailures=-1),
        ["spec.failurePolicy.maxFailures", "greater than or equal to 0"],
    ),
    "unknown field": (job(bogusField=1), ['unknown field "spec.bogusField"']),
    "70-character name": (job(name="a" * 70), ["metadata.name must be at most"]),
}


@pytest.mark.parametrize("case", CASES)
def test_kubectl_apply_refuses_invalid_job(crd_only, case):
    doc, expected = CASES[case]
    p = crd_only.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc), check=False)
    assert p.returncode != 0, f"kubectl apply accepted it:\n{p.stdout}"
    for text in expected:
        assert text in p.stderr, f"{text!r} not in kubectl's message:\n{p.stderr}"
    got = crd_only.kubectl("get", "tj", doc["metadata"]["name"], check=False)
    assert got.returncode != 0 and "NotFound" in got.stderr, got.stdout
    assert crd_only.kubectl("get", "tj", "-o", "name").stdout.strip() == ""


def test_valid_example_is_accepted_by_server_side_dry_run(crd_only):
    """The control: the example itself passes the same validation (so the refusals above are about the changes)."""
    p = crd_only.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(job("good-job")))
    assert "trainingjob.ftjob.dev/good-job created (server dry run)" in p.stdout
    assert crd_only.kubectl("get", "tj", "-o", "name").stdout.strip() == ""
