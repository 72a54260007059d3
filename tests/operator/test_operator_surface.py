"""The public surface: API field names, CLI subcommands, example jobs. A change here must be deliberate."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import jsonschema
import pytest
import yaml
from ftjob_operator import api, cli, crd

ROOT = Path(__file__).resolve().parents[2]


def _fields(model) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def test_spec_field_names():
    assert _fields(api.TrainingJobSpec) == [
        "image",
        "imagePullPolicy",
        "command",
        "args",
        "workers",
        "processesPerWorker",
        "resources",
        "coordinatorResources",
        "checkpoint",
        "preemption",
        "failurePolicy",
        "rendezvous",
        "trainer",
        "suspend",
        "ttlSecondsAfterFinished",
        "cleanPodPolicy",
        "scheduling",
        "podTemplate",
    ]
    assert _fields(api.WorkersSpec) == ["min", "max", "replicas", "spares"]
    assert _fields(api.CheckpointSpec) == [
        "volume",
        "uri",
        "credentialsSecret",
        "mountPath",
        "everySteps",
        "keepLast",
        "asyncSave",
        "suspendTimeoutSeconds",
        "memoryTier",
    ]
    assert _fields(api.MemoryTierSpec) == ["enabled", "sizeLimit"]
    assert _fields(api.CheckpointVolume) == ["persistentVolumeClaim", "hostPath", "emptyDir"]
    assert _fields(api.PreemptionSpec) == ["gracePeriodSeconds", "maxPreemptions", "checkpointOnNotice"]
    assert _fields(api.FailurePolicySpec) == [
        "maxFailures",
        "backoffBaseSeconds",
        "backoffMaxSeconds",
        "jitter",
    ]
    assert _fields(api.SchedulingSpec) == ["nodeSelector", "tolerations", "affinity", "priorityClassName"]
    assert _fields(api.SchedulingRoles) == ["workers", "coordinator", "spread"]
    assert _fields(api.PodTemplateSpec) == [
        "labels",
        "annotations",
        "env",
        "volumes",
        "volumeMounts",
        "securityContext",
        "podSecurityContext",
        "serviceAccountName",
        "imagePullSecrets",
    ]
    assert _fields(api.TrainerSpec) == [
        "model",
        "steps",
        "globalBatchSize",
        "seqLen",
        "learningRate",
        "seed",
        "data",
        "flags",
    ]


def test_status_field_names_and_vocabularies():
    assert _fields(api.TrainingJobStatus) == [
        "phase",
        "conditions",
        "observedGeneration",
        "workers",
        "selector",
        "preemptions",
        "failures",
        "restarts",
        "lastCheckpoint",
        "lastCheckpointFailure",
        "step",
        "image",
        "startTime",
        "completionTime",
        "lastFailure",
        "progress",
        "operator",
    ]
    assert _fields(api.ProgressStatus) == [
        "percent",
        "totalSteps",
        "etaSeconds",
        "stepsPerSecond",
        "tokensPerSecond",
        "elapsedSeconds",
        "keptSeconds",
        "goodput",
        "lost",
        "updatedAt",
    ]
    assert _fields(api.LostStatus) == ["preemptions", "failures"]
    assert _fields(api.LostTime) == ["seconds", "steps"]
    assert _fields(api.OperatorStatus) == [
        "restartGeneration",
        "nextPodIndex",
        "backoffUntil",
        "podTemplateHash",
        "handledCheckpointRequest",
        "suspendRequestedAt",
        "coordinatorLostAt",
        "lastPreemptionTime",
        "handledErrorId",
        "worldEpoch",
        "knownPods",
        "retiredPods",
        "pendingPods",
        "noticedPods",
        "run",
        "interruption",
        "noticedAt",
        "suspendedSeconds",
    ]
    assert _fields(api.Condition) == [
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    ]
    assert api.CONDITION_TYPES == (
        "Created",
        "Running",
        "Restarting",
        "Preempted",
        "Suspended",
        "Succeeded",
        "Failed",
        "InvalidSpec",
        "CheckpointFailing",
    )
    assert set(api.FINISHED_PHASES) <= set(api.PHASES)


def test_cli_subcommands():
    parser = cli._parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == list(cli.SUBCOMMANDS) == ["operator", "crd", "local", "demo"]


def test_ftjob_crd_prints_the_generated_yaml(capsys):
    assert cli.main(["crd"]) == 0
    assert capsys.readouterr().out == crd.render_yaml()
    assert cli.main(["crd", "--check"]) == 0


def test_ftjob_crd_write_writes_both_copies(tmp_path, monkeypatch):
    monkeypatch.setattr(crd, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(crd.write, "__defaults__", (tmp_path,))
    assert cli.main(["crd", "--write"]) == 0
    for rel in crd.CRD_PATHS:
        assert (tmp_path / rel).read_text() == crd.render_yaml()


def test_ftjob_operator_passes_its_flags_to_the_handlers(monkeypatch):
    seen = {}
    handlers = types.ModuleType("ftjob_operator.handlers")
    handlers.run = lambda **kw: seen.update(kw) or 0
    monkeypatch.setitem(sys.modules, "ftjob_operator.handlers", handlers)
    args = [
        "operator",
        "-n",
        "a",
        "--namespace",
        "b",
        "--kubeconfig",
        "/k",
        "--log-level",
        "debug",
        "--peering",
        "p",
    ]
    assert cli.main(args) == 0
    assert seen == {
        "namespaces": ["a", "b"],
        "kubeconfig": "/k",
        "log_level": "DEBUG",
        "metrics_port": 8080,
        "peering": "p",
        "network_policy": True,
    }
    assert cli.main(["operator"]) == 0 and seen["namespaces"] == []  # all namespaces
    assert cli.main(["operator", "--no-network-policy"]) == 0 and seen["network_policy"] is False


def test_ftjob_operator_rejects_a_bad_port(capsys):
    assert cli.main(["operator", "--metrics-port", "70000"]) == 2
    assert "--metrics-port must be 0..65535" in capsys.readouterr().err


def test_local_and_demo_pass_their_arguments_through(monkeypatch):
    calls = []
    for name in ("ftjob_local.cli", "ftjob_local.demo"):
        mod = types.ModuleType(name)
        mod.main = lambda argv, name=name: calls.append((name, argv)) or 0
        monkeypatch.setitem(sys.modules, name, mod)
    assert cli.main(["local", "preempt", "local-spot-0", "--hard"]) == 0
    assert cli.main(["demo", "--steps", "50"]) == 0
    assert calls == [
        ("ftjob_local.cli", ["preempt", "local-spot-0", "--hard"]),
        ("ftjob_local.demo", ["--steps", "50"]),
    ]


def test_a_missing_local_module_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ftjob_local.demo", None)  # an import of it raises ModuleNotFoundError
    assert cli.main(["demo"]) == 1
    assert "needs the module ftjob_local.demo" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m_runs_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "ftjob_operator", "crd"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout == crd.render_yaml()


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_are_valid_jobs(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    jobs = [d for d in docs if d.get("kind") == api.KIND]
    assert jobs, f"{path.name} has no TrainingJob"
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for doc in jobs:
        jsonschema.Draft4Validator(schema).validate(doc)
        spec = api.parse_spec(doc["spec"])
        assert api.spec_problems(doc["metadata"]["name"], spec) == []


def test_local_tiny_example_is_small():
    doc = next(
        d
        for d in yaml.safe_load_all((ROOT / "examples/local-tiny.yaml").read_text())
        if d["kind"] == api.KIND
    )
    spec = api.parse_spec(doc["spec"])
    assert spec.workers.desired == 2 and spec.trainer.model == "tiny" and 60 <= spec.trainer.steps <= 120
    assert spec.checkpoint.every_steps == 10 and spec.preemption.grace_period_seconds == 20
    assert spec.checkpoint.volume.empty_dir is None  # replaced workers must find the checkpoints
