"""The operator pod the chart renders passes Pod Security "restricted"; the check itself catches each violation."""

from __future__ import annotations

import copy

import pytest
from chart_helpers import HA_NAMESPACED, one, render
from chart_pod_security import restricted_violations
from ftjob_operator import api
from ftjob_operator import render as trainer_render

GOOD = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "main",
            "image": "x",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
    "volumes": [{"name": "tmp", "emptyDir": {}}],
}


def mutate(path: str, value) -> dict:
    """GOOD with one field set: path like 'containers.0.securityContext.privileged'."""
    spec = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = spec
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value
    return spec


def operator_pod(values: dict[str, str] | None = None) -> dict:
    return one(render(values), "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize("values", [None, HA_NAMESPACED], ids=["defaults", "ha-namespaced"])
def test_operator_pod_passes_restricted(values):
    pod = operator_pod(values)
    assert restricted_violations(pod) == []
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert set(container["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def test_a_values_override_that_weakens_the_pod_is_caught():
    pod = operator_pod(
        {"securityContext.allowPrivilegeEscalation": "true", "podSecurityContext.runAsUser": "0"}
    )
    found = restricted_violations(pod)
    assert "containers[operator].securityContext.allowPrivilegeEscalation must be false" in found
    assert "spec.securityContext.runAsUser must not be 0" in found


def test_the_good_spec_passes():
    assert restricted_violations(GOOD) == []


@pytest.mark.parametrize(
    ("path", "value", "violation"),
    [
        ("hostNetwork", True, "spec.hostNetwork must be false"),
        ("hostPID", True, "spec.hostPID must be false"),
        ("hostIPC", True, "spec.hostIPC must be false"),
        ("containers.0.securityContext.privileged", True, "privileged must be false"),
        ("containers.0.securityContext.capabilities", {"add": ["SYS_ADMIN"], "drop": ["ALL"]}, "SYS_ADMIN"),
        (
            "containers.0.securityContext.capabilities",
            {"drop": ["NET_RAW"]},
            "capabilities.drop must include ALL",
        ),
        (
            "containers.0.securityContext.allowPrivilegeEscalation",
            True,
            "allowPrivilegeEscalation must be false",
        ),
        ("containers.0.securityContext.runAsNonRoot", False, "runAsNonRoot must be true"),
        ("securityContext.runAsNonRoot", None, "runAsNonRoot must be true"),
        ("containers.0.securityContext.runAsUser", 0, "runAsUser must not be 0"),
        (
            "securityContext.seccompProfile",
            {"type": "Unconfined"},
            "seccompProfile.type must be RuntimeDefault",
        ),
        ("securityContext.seccompProfile", None, "seccompProfile must be RuntimeDefault or Localhost"),
        ("containers.0.securityContext.seccompProfile", {"type": "Unconfined"}, "not 'Unconfined'"),
        ("volumes", [{"name": "h", "hostPath": {"path": "/"}}], "uses ['hostPath']"),
        ("containers.0.ports", [{"containerPort": 80, "hostPort": 80}], "must not set hostPort"),
        ("containers.0.securityContext.procMount", "Unmasked", "procMount must be Default"),
        ("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}], "sysctl 'kernel.msgmax'"),
        ("securityContext.seLinuxOptions", {"type": "spc_t"}, "seLinuxOptions.type 'spc_t' is not allowed"),
        ("containers.0.securityContext.appArmorProfile", {"type": "Unconfined"}, "appArmorProfile.type"),
        ("securityContext.windowsOptions", {"hostProcess": True}, "hostProcess must not be true"),
    ],
)
def test_each_restricted_rule_is_checked(path, value, violation):
    found = restricted_violations(mutate(path, value))
    assert any(violation in v for v in found), f"{path}={value!r} not reported; got {found}"


def test_init_and_ephemeral_containers_are_checked_too():
    spec = copy.deepcopy(GOOD)
    spec["initContainers"] = [{"name": "init", "image": "x"}]
    found = restricted_violations(spec)
    assert "initContainers[init].securityContext.allowPrivilegeEscalation must be false" in found
    assert "initContainers[init].securityContext.capabilities.drop must include ALL" in found


def _trainer_pods(volume: dict) -> dict[str, dict]:
    spec = api.parse_spec({"image": "x", "workers": {"min": 1, "max": 2}, "checkpoint": {"volume": volume}})
    ref = trainer_render.JobRef(name="tj", namespace="ns", uid="0d5f3c1e-0000-4000-8000-000000000001")
    return {
        "coordinator": trainer_render.render_coordinator_pod(ref, spec, index=0, generation=0),
        "worker": trainer_render.render_worker_pod(
            ref, spec, index=1, generation=0, coordinator_ip="10.96.0.7"
        ),
    }


def test_trainer_pods_the_operator_renders_pass_restricted():
    for role, pod in _trainer_pods({"persistentVolumeClaim": {"claimName": "ck"}}).items():
        assert restricted_violations(pod["spec"]) == [], role


def test_a_host_path_checkpoint_volume_is_reported_as_not_restricted():
    # hostPath is for the local cluster; the check must say so rather than pass it.
    worker = _trainer_pods({"hostPath": {"path": "/tmp/ck"}})["worker"]
    assert any("hostPath" in v for v in restricted_violations(worker["spec"]))
