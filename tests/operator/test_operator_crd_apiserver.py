"""The generated CRD on a real API surface: the local API server with the real kubectl.

Checks what only a server shows: defaults applied, CEL rules enforced, the scale subresource, the status
subresource accepting the planner's status, and the printer columns.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from ftjob_trainer.contract import format_time_micro
from support.apiserver import apiserver_with_crd
from tj_builders import NOW, Store, converge

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def kube(tmp_path):
    with apiserver_with_crd(tmp_path) as kubectl:
        yield kubectl


def test_example_applies_with_defaults_scale_and_cel(kube):
    kube("apply", "-f", str(ROOT / "examples" / "local-tiny.yaml"))
    tj = json.loads(kube("get", "tj", "local-tiny", "-o", "json").stdout)
    assert tj["spec"]["failurePolicy"]["jitter"] == 0.2  # a server-side default
    assert tj["spec"]["checkpoint"]["mountPath"] == "/checkpoints"
    assert tj["spec"]["preemption"] == {"gracePeriodSeconds": 20, "checkpointOnNotice": True}

    kube("scale", "tj", "local-tiny", "--replicas=1")
    assert (
        json.loads(kube("get", "tj", "local-tiny", "-o", "json").stdout)["spec"]["workers"]["replicas"] == 1
    )
    refused = kube("scale", "tj", "local-tiny", "--replicas=5", check=False)
    assert refused.returncode != 0 and "spec.workers.replicas must be within" in refused.stderr

    bad = {
        "apiVersion": "ftjob.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "bad"},
        "spec": {"image": "x", "workers": {"min": 3, "max": 2}},
    }
    refused = kube("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "spec.workers.min must be <= spec.workers.max" in refused.stderr


def test_kubectl_explain_defines_progress_and_goodput(kube):
    """`kubectl explain` reads the CRD's descriptions (the API models'): what users read about status.progress."""
    progress = kube("explain", "trainingjob.status.progress").stdout
    for field in (
        "etaSeconds",
        "goodput",
        "keptSeconds",
        "elapsedSeconds",
        "lost",
        "percent",
        "tokensPerSecond",
    ):
        assert field in progress, progress
    goodput = kube("explain", "trainingjob.status.progress.goodput").stdout
    assert "keptSeconds / elapsedSeconds" in " ".join(goodput.split()), goodput
    lost = kube("explain", "trainingjob.status.progress.lost.preemptions.seconds").stdout
    assert "from the last kept step" in " ".join(lost.split()), lost


def test_status_subresource_accepts_the_planners_status_and_prints_columns(kube):
    kube("apply", "-f", str(ROOT / "examples" / "local-tiny.yaml"))
    tj = json.loads(kube("get", "tj", "local-tiny", "-o", "json").stdout)
    store = Store(tj)
    converge(store, NOW)  # the pods start at NOW; a minute later, step 42
    store.progress = {
        "step": 42,
        "stepTime": format_time_micro(NOW + timedelta(seconds=50)),
        "worldSize": 2,
        "totalSteps": 100,
        "tokensPerSecond": 1234.5,
        "run": {
            "startedAt": format_time_micro(NOW + timedelta(seconds=5)),
            "resumedFromStep": 0,
            "firstStepTime": format_time_micro(NOW + timedelta(seconds=10)),
        },
        "lastCheckpoint": {"step": 40, "time": "2026-01-01T11:59:00Z", "path": "/ck/40"},
    }
    converge(store, NOW + timedelta(seconds=60))
    status = store.status
    assert status["phase"] == "Running"
    patch = json.dumps({"status": status})
    kube("patch", "tj", "local-tiny", "--subresource=status", "--type=merge", "-p", patch)
    stored = json.loads(kube("get", "tj", "local-tiny", "-o", "json").stdout)["status"]
    assert stored == status  # nothing pruned: the schema knows every field the planner writes
    table = kube("get", "tj", "local-tiny").stdout.split("\n")
    assert table[0].split()[:8] == [
        "NAME",
        "PHASE",
        "READY",
        "PROGRESS",
        "ETA",
        "GOODPUT",
        "PREEMPTIONS",
        "FAILURES",
    ]
    # 42 of 100 steps; 41 steps in the 40 s since the first: 58 more take 57 s; 40 kept of 60 elapsed seconds.
    assert table[1].split()[:8] == ["local-tiny", "Running", "2", "42", "57", "0.6667", "0", "0"]
    wide = kube("get", "tj", "local-tiny", "-o", "wide").stdout.split("\n")
    assert wide[0].split()[-8:] == [
        "AGE",
        "DESIRED",
        "STEP",
        "CHECKPOINT",
        "LOST",
        "TO",
        "PREEMPTIONS",
        "TOKENS/S",
    ]
    assert wide[1].split()[-5:] == ["2", "42", "40", "0", "1234.5"]
    scale = json.loads(
        kube(
            "get", "--raw", "/apis/ftjob.dev/v1alpha1/namespaces/default/trainingjobs/local-tiny/scale"
        ).stdout
    )
    assert scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == "ftjob.dev/job-name=local-tiny,ftjob.dev/role=worker"
