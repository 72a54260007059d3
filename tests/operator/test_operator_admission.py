"""Refuse at admission (issue 14, point 5): what is decidable from the object alone is refused by `kubectl
apply` with a message naming the field, and nothing is created. Only the local API server and the generated
CRD take part (no node agent, no operator), as on a real cluster where the CRD's schema and CEL rules are all
there is.

One row per class: schema bounds (integers, sane maxima), formats (image reference, quantities), the model
preset pattern (presets and hf:), CEL rules for reserved env and volume names and mount paths, required
sub-objects. What needs the cluster (a missing PVC) is never refused here: docs/INTERFACES.md."""

from __future__ import annotations

import json

import pytest
from support.apiserver import apiserver_with_crd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    with apiserver_with_crd(tmp_path_factory.mktemp("admission")) as kubectl:
        yield kubectl


class AsIs(dict):
    """A spec sent exactly as written (the others get the required `workers: {}` unless they set workers)."""


def job(spec: object = ..., name: str = "bad-job") -> str:
    doc: dict = {"apiVersion": "ftjob.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name}}
    if isinstance(spec, dict) and not isinstance(spec, AsIs):
        spec = {"workers": {}, **spec}
    if spec is not ...:
        doc["spec"] = spec
    return json.dumps(doc)


def mounts(path: str) -> dict:
    return {
        "podTemplate": {
            "volumes": [{"name": "extra", "emptyDir": {}}],
            "volumeMounts": [{"name": "extra", "mountPath": path}],
        }
    }


# case: (spec, texts kubectl's message must hold: the field's path first)
REFUSED = {
    # schema bounds: integers, not floats; sane maxima
    "steps 1e30 (not an integer JSON carries)": (
        {"trainer": {"steps": 1e30}},
        ["spec.trainer.steps", 'must be of type integer: "number"'],
    ),
    "steps above the maximum": (
        {"trainer": {"steps": 10**13}},
        ["spec.trainer.steps", "should be less than or equal to 1000000000000"],
    ),
    "fractional seqLen": ({"trainer": {"seqLen": 128.5}}, ["spec.trainer.seqLen", "must be of type integer"]),
    "negative seed": ({"trainer": {"seed": -1}}, ["spec.trainer.seed", "greater than or equal to 0"]),
    "everySteps above the maximum": (
        {"checkpoint": {"everySteps": 10**13}},
        ["spec.checkpoint.everySteps", "less than or equal to"],
    ),
    "ttl above ten years": (
        {"ttlSecondsAfterFinished": 10**10},
        ["spec.ttlSecondsAfterFinished", "less than or equal to"],
    ),
    # formats
    "malformed image reference": ({"image": "Not An Image!"}, ["spec.image", "should match"]),
    "image with an empty tag": ({"image": "trainer:"}, ["spec.image", "should match"]),
    "emptyDir sizeLimit not a quantity": (
        {"checkpoint": {"volume": {"emptyDir": {"sizeLimit": "lots"}}}},
        ["spec.checkpoint.volume.emptyDir.sizeLimit", "should match"],
    ),
    "memory tier sizeLimit not a quantity": (
        {"checkpoint": {"memoryTier": {"sizeLimit": "8 GB"}}},
        ["spec.checkpoint.memoryTier.sizeLimit", "should match"],
    ),
    # model presets and hf: paths
    "unknown model preset": (
        {"trainer": {"model": "gpt-99"}},
        ["spec.trainer.model", '"gpt-99"', "should match"],
    ),
    "hf: without a path": ({"trainer": {"model": "hf:"}}, ["spec.trainer.model", "should match"]),
    # CEL: reserved names and paths
    "reserved env name": (
        {"podTemplate": {"env": [{"name": "FTJOB_TOKEN", "value": "mine"}]}},
        ["spec.podTemplate.env[0]", "spec.podTemplate.env[].name is set by the operator", "FTJOB_TOKEN"],
    ),
    "env without a name": (
        {"podTemplate": {"env": [{"value": "x"}]}},
        ["spec.podTemplate.env[0].name: Required value"],
    ),
    "reserved volume name": (
        {"podTemplate": {"volumes": [{"name": "ftjob-dshm", "emptyDir": {}}]}},
        ["spec.podTemplate.volumes[0]", "spec.podTemplate.volumes[].name is taken by ftjob"],
    ),
    "duplicate volume name": (
        {"podTemplate": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}},
        ["spec.podTemplate.volumes[1]: Duplicate value"],
    ),
    "mount at /dev/shm": (
        mounts("/dev/shm"),
        ["spec.podTemplate.volumeMounts[0]", "mountPath /dev/shm is ftjob's shared-memory volume"],
    ),
    "mount at the checkpoint path": (
        mounts("/checkpoints"),
        ["spec.podTemplate.volumeMounts[].mountPath must differ from spec.checkpoint.mountPath"],
    ),
    "reserved trainer flag": (
        {"trainer": {"flags": {"checkpoint-dir": "/tmp"}}},
        ["spec.trainer.flags", "must not set flags derived from spec.checkpoint/preemption"],
    ),
    "trainer flag with dashes": (
        {"trainer": {"flags": {"--warmup-steps": "5"}}},
        ["spec.trainer.flags", "keys must look like a flag name without dashes"],
    ),
    # required sub-objects
    "empty command": ({"command": []}, ["spec.command", "should have at least 1 items"]),
    "no spec": (..., ["spec: Required value"]),
    "empty spec": (AsIs(), ["spec.workers: Required value"]),
    "spec without workers": (
        AsIs(image="trainer:1", trainer={"steps": 10}),
        ["spec.workers: Required value"],
    ),
    "null spec": (None, ["spec: Required value"]),
    "checkpoint volume without a source": (
        {"checkpoint": {"volume": {}}},
        ["spec.checkpoint.volume", "needs exactly one of persistentVolumeClaim, hostPath, emptyDir"],
    ),
    "persistentVolumeClaim without claimName": (
        {"checkpoint": {"volume": {"persistentVolumeClaim": {}}}},
        ["spec.checkpoint.volume.persistentVolumeClaim.claimName: Required value"],
    ),
}

ACCEPTED = {
    "workers only: every other field has a default (image: the operator's)": AsIs(workers={}),
    "integral float steps (as the API server reads JSON numbers)": {"trainer": {"steps": 5.0}},
    "hf: model": {"trainer": {"model": "hf:Qwen/Qwen2.5-0.5B"}},
    "each preset": {"trainer": {"model": "1b"}},
    "registry image with port and digest": {"image": "registry.local:5000/ml/trainer@sha256:" + "ab" * 32},
    "quantities": {
        "checkpoint": {"volume": {"emptyDir": {"sizeLimit": "1.5Gi"}}, "memoryTier": {"sizeLimit": "8G"}}
    },
    "user env, volume and mount": {
        "podTemplate": {
            "env": [{"name": "HF_HOME", "value": "/cache"}],
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        }
    },
}


@pytest.mark.parametrize("case", REFUSED)
def test_kubectl_apply_refuses_with_the_field_named(kube, case):
    spec, expected = REFUSED[case]
    p = kube("apply", "-f", "-", stdin=job(spec), check=False)
    assert p.returncode != 0, f"kubectl apply accepted it:\n{p.stdout}"
    assert 'The TrainingJob "bad-job" is invalid' in p.stderr, p.stderr
    for text in expected:
        assert text in p.stderr, f"{text!r} not in kubectl's message:\n{p.stderr}"
    got = kube("get", "tj", "bad-job", check=False)
    assert got.returncode != 0 and "NotFound" in got.stderr, got.stdout
    assert kube("get", "tj", "-o", "name").stdout.strip() == ""


@pytest.mark.parametrize("case", ACCEPTED)
def test_valid_neighbours_are_accepted(kube, case):
    """The controls: each refusal above is about its change, not about something else in the object."""
    p = kube("apply", "--dry-run=server", "-f", "-", stdin=job(ACCEPTED[case], name="good-job"), check=False)
    assert p.returncode == 0, p.stderr
    assert "trainingjob.ftjob.dev/good-job created (server dry run)" in p.stdout
