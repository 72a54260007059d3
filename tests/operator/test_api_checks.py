"""api.checks: what the schema cannot express, one fix-it line per problem (the planner's InvalidSpec message)."""

from __future__ import annotations

import pytest
from ftjob_operator import api
from ftjob_operator.api import reserved
from pydantic import ValidationError
from tj_builders import spec


def _problems(name: str = "tj", **overrides) -> list[str]:
    return api.spec_problems(name, api.parse_spec(spec(**overrides)))


def test_a_usable_spec_has_no_problems():
    assert _problems() == []
    volumes = [{"name": "data", "emptyDir": {}}]
    mounts = [{"name": "data", "mountPath": "/data"}]
    template = {"env": [{"name": "MY_FLAG", "value": "1"}], "volumes": volumes, "volumeMounts": mounts}
    assert _problems(podTemplate=template, trainer={"flags": {"warmup-steps": "5"}}) == []


@pytest.mark.parametrize(
    "name,overrides,problem",
    [
        ("9lives", {}, "metadata.name '9lives' must be a DNS-1035 label of at most 51 characters"),
        ("a" * 52, {}, "must be a DNS-1035 label of at most 51 characters"),
        ("tj", {"command": []}, "spec.command is empty"),
        ("tj", {"podTemplate": {"env": [{"value": "x"}]}}, "spec.podTemplate.env[0] needs a name"),
        (
            "tj",
            {"podTemplate": {"env": [{"name": "FTJOB_TOKEN", "value": "x"}]}},
            "spec.podTemplate.env[0].name FTJOB_TOKEN is set by the operator; use another name",
        ),
        (
            "tj",
            {"podTemplate": {"env": [{"name": "FTJOB_MEMORY_CHECKPOINT_DIR", "value": "/x"}]}},
            "FTJOB_MEMORY_CHECKPOINT_DIR is set by the operator",
        ),
        ("tj", {"podTemplate": {"volumes": [{"emptyDir": {}}]}}, "spec.podTemplate.volumes[0] needs a name"),
        (
            "tj",
            {"podTemplate": {"volumes": [{"name": "ftjob-dshm", "emptyDir": {}}]}},
            "spec.podTemplate.volumes[0].name ftjob-dshm is taken by ftjob; rename it",
        ),
        (
            "tj",
            {"podTemplate": {"volumes": [{"name": "d", "emptyDir": {}}, {"name": "d", "emptyDir": {}}]}},
            "spec.podTemplate.volumes[1].name d appears twice",
        ),
        (
            "tj",
            {"podTemplate": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}},
            "spec.podTemplate.volumeMounts[0] mounts volume 'data', which no volume defines",
        ),
        (
            "tj",
            {"podTemplate": {"volumeMounts": [{"name": "ftjob-checkpoints", "mountPath": "/checkpoints"}]}},
            "spec.podTemplate.volumeMounts[0].mountPath /checkpoints is used by ftjob; pick another path",
        ),
        (
            "tj",
            {"podTemplate": {"volumeMounts": [{"name": "ftjob-dshm", "mountPath": "/dev/shm"}]}},
            "spec.podTemplate.volumeMounts[0].mountPath /dev/shm is used by ftjob; pick another path",
        ),
        (
            "tj",
            {"podTemplate": {"labels": {"ftjob.dev/role": "x"}}},
            "spec.podTemplate.labels ftjob.dev/role: ftjob.dev/* labels belong to the operator",
        ),
        (
            "tj",
            {"trainer": {"flags": {"--lr": "1"}}},
            "spec.trainer.flags key '--lr' must look like a flag name without dashes, e.g. warmup-steps",
        ),
        (
            "tj",
            {"trainer": {"flags": {"memory-checkpoint-dir": "/x"}}},
            "spec.trainer.flags memory-checkpoint-dir is set from spec.checkpoint/preemption; set it there",
        ),
    ],
)
def test_each_problem_says_what_to_fix(name, overrides, problem):
    problems = _problems(name, **overrides)
    assert len(problems) == 1 and problem in problems[0], problems


def test_every_problem_is_reported_at_once():
    template = {"env": [{"name": "POD_IP", "value": "x"}], "labels": {"ftjob.dev/x": "y"}}
    assert len(_problems("9lives", command=[], podTemplate=template)) == 4


def test_reserved_names_are_the_ones_the_pods_get():
    assert {reserved.CHECKPOINT_VOLUME, reserved.SHM_VOLUME} == reserved.RESERVED_VOLUMES
    assert {
        reserved.ENV_COORDINATOR_ADDR,
        reserved.ENV_MEMORY_CHECKPOINT_DIR,
    } <= reserved.RESERVED_ENV


def test_validation_errors_read_as_fix_it_lines():
    with pytest.raises(ValidationError) as exc:
        api.parse_spec(spec(workers={"min": 3, "max": 2}, checkpoint={"keepLast": 0}))
    lines = api.validation_problems(exc.value)
    assert "spec.checkpoint.keepLast: Input should be greater than or equal to 1" in lines
    assert "spec.workers: spec.workers.min (3) must be <= spec.workers.max (2)" in lines


def test_model_presets_are_the_trainers():
    from ftjob_trainer.models import PRESETS

    assert set(api.trainer.MODEL_PRESETS) == set(PRESETS)


@pytest.mark.parametrize(
    "trainer,field",
    [
        ({"model": "gpt-99"}, "spec.trainer.model"),
        ({"model": "hf:"}, "spec.trainer.model"),
        ({"steps": 1e30}, "spec.trainer.steps"),
        ({"seed": -1}, "spec.trainer.seed"),
    ],
)
def test_the_planner_refuses_what_the_crd_refuses(trainer, field):
    """An object stored before the CRD had these bounds still ends InvalidSpec, never a crash or a retry loop."""
    with pytest.raises(ValidationError) as exc:
        api.parse_spec(spec(trainer=trainer))
    assert any(line.startswith(field) for line in api.validation_problems(exc.value))


def test_hf_models_and_image_references_parse():
    parsed = api.parse_spec(spec(image="ghcr.io/org/trainer:v1", trainer={"model": "hf:org/model"}))
    assert parsed.trainer.model == "hf:org/model"
    with pytest.raises(ValidationError):
        api.parse_spec(spec(image="Not An Image!"))
