"""`helm install` of the chart into the embedded local cluster, as a user would: CRDs, RBAC (a Role in the managed
namespace), Deployment, upgrade to HA in other namespaces (the token key kept), uninstall, and bad values refused by
`helm install` itself.

The operator running under the chart's ServiceAccount until a TrainingJob succeeds, and failing when a verb is
missing, is test_install_operator_rbac.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from chart_helpers import CHART, ROOT, set_args, tool
from chart_pod_security import restricted_violations

pytestmark = pytest.mark.slow
RELEASE, NS = "ftjob", "ftjob-system"


@pytest.fixture(scope="module")
def kube_env(tmp_path_factory):
    state = tmp_path_factory.mktemp("local-cluster")
    ftjob = [sys.executable, "-m", "ftjob_operator.cli", "local"]
    up = subprocess.run(
        [*ftjob, "up", "--state-dir", str(state), "--no-operator", "--nodes", "1", "--spot-nodes", "0"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    try:
        assert up.returncode == 0, f"ftjob local up failed:\n{up.stdout}\n{up.stderr}"
        yield {
            **os.environ,
            "KUBECONFIG": str(state / "kubeconfig"),
            "HELM_CACHE_HOME": str(state / "helm-cache"),
            "HELM_CONFIG_HOME": str(state / "helm-config"),
            "HELM_DATA_HOME": str(state / "helm-data"),
        }
    finally:
        subprocess.run(
            [*ftjob, "down", "--state-dir", str(state)], capture_output=True, timeout=120, cwd=ROOT
        )


def run(env, binary: str, *args: str, check: bool = True, stdin: str | None = None):
    proc = subprocess.run(
        [tool(binary), *args], capture_output=True, text=True, env=env, timeout=180, input=stdin
    )
    if check:
        assert proc.returncode == 0, f"{binary} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def get(env, *args: str) -> dict:
    return json.loads(run(env, "kubectl", "get", *args, "-o", "json").stdout)


def names(env, kind: str, namespace: str | None = None) -> set[str]:
    scope = ["-n", namespace] if namespace else []
    return {i["metadata"]["name"] for i in get(env, kind, *scope)["items"]}


def test_bad_values_are_refused_by_helm_install(kube_env, tmp_path):
    bad = tmp_path / "values.yaml"
    bad.write_text("replicaCount: two\n")
    proc = run(
        kube_env,
        "helm",
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        "--create-namespace",
        "-f",
        str(bad),
        check=False,
    )
    assert proc.returncode != 0
    assert "replicaCount: Invalid type. Expected: integer, given: string" in proc.stderr
    assert RELEASE not in run(kube_env, "helm", "list", "-n", NS, "-q").stdout.split()


def test_install_upgrade_uninstall(kube_env):
    run(kube_env, "helm", "install", RELEASE, str(CHART), "-n", NS, "--create-namespace")
    assert "trainingjobs.ftjob.dev" in names(kube_env, "crd"), "helm installs crds/ first"
    assert f"{RELEASE}-cluster" in names(kube_env, "clusterrole") and RELEASE not in names(
        kube_env, "clusterrole"
    )
    assert RELEASE in names(kube_env, "role", "default"), "the default install manages the default namespace"
    deployment = get(kube_env, "deployment", RELEASE, "-n", NS)
    assert restricted_violations(deployment["spec"]["template"]["spec"]) == [], "as stored by the API server"
    assert RELEASE in names(kube_env, "serviceaccount", NS)

    # Namespaced RBAC needs the namespaces to exist; the operator's Roles land in them.
    manifest = "".join(
        f"---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n" for ns in ("team-a", "team-b")
    )
    run(kube_env, "kubectl", "apply", "-f", "-", stdin=manifest)
    ha = {"replicaCount": "2", "peering.enabled": "true", "watchNamespaces": "{team-a,team-b}"}
    key = get(kube_env, "secret", f"{RELEASE}-token-key", "-n", NS)["data"]["key"]
    run(kube_env, "helm", "upgrade", RELEASE, str(CHART), "-n", NS, *set_args(ha))
    assert RELEASE not in names(kube_env, "clusterrole"), "no cluster-wide grant of pods or secrets"
    assert get(kube_env, "secret", f"{RELEASE}-token-key", "-n", NS)["data"]["key"] == key, "kept on upgrade"
    for ns in ("team-a", "team-b"):
        assert RELEASE in names(kube_env, "role", ns) and RELEASE in names(kube_env, "rolebinding", ns)
    assert RELEASE not in names(kube_env, "role", "default"), "watchNamespaces replaced the default"
    assert "kopfpeerings.kopf.dev" in names(kube_env, "crd")
    assert get(kube_env, "deployment", RELEASE, "-n", NS)["spec"]["replicas"] == 2

    run(kube_env, "helm", "uninstall", RELEASE, "-n", NS)
    assert RELEASE not in names(kube_env, "deployment", NS)
    assert not {RELEASE, f"{RELEASE}-cluster"} & names(kube_env, "clusterrole")
    assert RELEASE not in names(kube_env, "role", "team-a")
    # CRDs outlive the release: helm never deletes crds/, and the peering CRD is marked keep.
    assert {"trainingjobs.ftjob.dev", "kopfpeerings.kopf.dev"} <= names(kube_env, "crd")


def test_plain_kubectl_apply_of_the_rendered_chart(kube_env, tmp_path):
    """The README's path without helm in the cluster: crds/ then the rendered chart, with kubectl apply."""
    run(kube_env, "kubectl", "apply", "-f", str(ROOT / "crds"))
    run(
        kube_env,
        "kubectl",
        "apply",
        "-f",
        "-",
        stdin="apiVersion: v1\nkind: Namespace\nmetadata: {name: ftjob-plain}\n",
    )
    rendered = tmp_path / "ftjob.yaml"
    rendered.write_text(run(kube_env, "helm", "template", "plain", str(CHART), "-n", "ftjob-plain").stdout)
    # Every object names its namespace (the Role lands in the managed one): no -n, which would clash with it.
    run(kube_env, "kubectl", "apply", "-f", str(rendered))
    assert "plain-ftjob" in names(kube_env, "deployment", "ftjob-plain")
    binding = get(kube_env, "rolebinding", "plain-ftjob", "-n", "default")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "plain-ftjob", "namespace": "ftjob-plain"}
    ]
    run(kube_env, "kubectl", "delete", "-f", str(rendered))
    assert "plain-ftjob-cluster" not in names(kube_env, "clusterrole")
