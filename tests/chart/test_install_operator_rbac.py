"""The chart's RBAC is enough for the operator, and nothing less would do: `helm install` into the local cluster,
then `ftjob operator` runs as a local process with the flags and environment of the Deployment the chart installed,
authenticated as the chart's ServiceAccount (a TokenRequest token in its kubeconfig), so the local API server holds
every request to the chart's (Cluster)Roles.

- the default install (a Role in `default`), HA cluster-wide (clusterWide: a ClusterRole, ClusterKopfPeering) and HA
  in another namespace (Roles and KopfPeering in watchNamespaces): a TrainingJob runs to Succeeded, its TTL deletes
  it, and the operator never heard
  a 403, not even one it survives (a refused event post, a kopf watch that falls back) -- that run sends every verb
  the chart grants, so a chart that lacks one fails here;
- the same install with one verb taken out of the operator's rule: the server answers 403, the operator says so
  (log line and an ApiError event on the job), and the job does not succeed;
- least privilege as an outsider sees it: the ServiceAccount cannot get a Secret anywhere (kube-system included,
  `kubectl auth can-i`), nor create a pod in a namespace the operator does not manage.

Workers run a stand-in trainer (stdlib only) under the real torchrun, with the real coordinator, so the test is about
the operator's requests and takes seconds per job.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, ROOT, set_args, tool

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

from ftjob_local.cluster import LocalCluster  # noqa: E402
from kubernetes import client as k8s  # noqa: E402
from kubernetes import config as k8s_config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402
from support.cluster import local_cluster  # noqa: E402
from support.operator_process import OperatorProcess  # noqa: E402
from support.wait import wait_until  # noqa: E402

RELEASE, NS = "ftjob", "ftjob-system"
TEAM = "team-a"  # the watched namespace of the namespaced install
# Installs whose operator must take a job to success: values, and the namespace the job runs in.
INSTALLS: dict[str, tuple[dict[str, str], str]] = {
    "defaults": ({}, "default"),
    "ha-cluster-wide": ({"replicaCount": "2", "peering.enabled": "true", "clusterWide": "true"}, "default"),
    "ha-namespaced": (
        {"replicaCount": "2", "peering.enabled": "true", "watchNamespaces": "{" + TEAM + "}"},
        TEAM,
    ),
}
# Installs with one verb taken out of the operator's (Cluster)Role (named like the release): (install, (kind,
# resource, verb), what the 403 says).
MISSING_VERBS = {
    "defaults-pods-create": (
        "defaults",
        ("Role", "pods", "create"),
        'cannot create resource "pods"',
    ),
    "ha-namespaced-status-patch": (
        "ha-namespaced",
        ("Role", "trainingjobs/status", "patch"),
        'cannot patch resource "trainingjobs" subresource "status"',
    ),
}
GROUP, VERSION, PLURAL = "ftjob.dev", "v1alpha1", "trainingjobs"
# Any 403 answer in the operator's log: the server's message ('... is forbidden: User "system:serviceaccount:..."
# cannot ...') as the operator's client layer (kube.py: "HTTP 403 Forbidden") and kopf's APIForbiddenError carry
# it, and kopf's own warnings when it falls back after a 403 on a list or watch ("Not enough permissions to ...").
FORBIDDEN = re.compile(r"HTTP 403|forbidden|not enough (rbac )?permissions", re.IGNORECASE)

# A stand-in for ftjob_trainer.train: report a step to the coordinator, write the "done" termination message, exit 0.
DONE_TRAINER = r"""
import json, os, urllib.request
if os.environ.get("GROUP_RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0":
    req = urllib.request.Request(os.environ["FTJOB_COORDINATOR_URL"] + "/v1/progress", method="POST",
                                 data=json.dumps({"step": 3}).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["FTJOB_TOKEN"],
                                          "Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()
with open(os.environ["FTJOB_TERMINATION_LOG"], "w") as f:
    json.dump({"step": 3, "checkpoint": None, "reason": "done", "exitCode": 0, "message": "finished"}, f)
print("stand-in trainer: done", flush=True)
"""


class ChartOperator(OperatorProcess):
    """`ftjob operator` as a local process with the chart Deployment's args and env."""

    def __init__(self, deployment: dict[str, Any], kubeconfig: Path, log_path: Path, secret_value):
        container = next(
            c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"
        )
        # The chart's metrics port is the pod's own; on this machine OperatorProcess takes a free one (the probes'
        # port does not matter to RBAC).
        args = [a for a in container["args"] if not a.startswith("--metrics-port=")]
        env = {
            **os.environ,
            **self._container_env(container, deployment["metadata"]["namespace"], secret_value),
        }
        super().__init__(kubeconfig, log_path, args=args, env=env, cwd=ROOT)

    @staticmethod
    def _container_env(container: dict[str, Any], namespace: str, secret_value) -> dict[str, str]:
        """The container's env as the kubelet would resolve it for a pod named ftjob-local-operator (a
        secretKeyRef read with the administrator's credentials, as the kubelet reads it: never the operator's)."""
        field_values = {"metadata.name": "ftjob-local-operator", "metadata.namespace": namespace}
        out = {}
        for var in container.get("env") or []:
            if "value" in var:
                out[var["name"]] = var["value"]
            elif "secretKeyRef" in var["valueFrom"]:
                ref = var["valueFrom"]["secretKeyRef"]
                out[var["name"]] = secret_value(namespace, ref["name"], ref["key"])
            else:
                path = var["valueFrom"]["fieldRef"]["fieldPath"]
                assert path in field_values, (
                    f"the test does not resolve env {var['name']} from {path}; add it"
                )
                out[var["name"]] = field_values[path]
        return out

    def forbidden_lines(self) -> list[str]:
        return [line for line in self.log().splitlines() if FORBIDDEN.search(line)]


class Cluster:
    """The local cluster after `helm install`: helm and kubectl as the administrator, a client as the chart's SA."""

    def __init__(self, local: LocalCluster, root: Path, stand_in: Path):
        self.local, self.root, self.stand_in = local, root, stand_in
        self.env = {
            **os.environ,
            "KUBECONFIG": str(local.kubeconfig),
            "HELM_CACHE_HOME": str(root / "helm-cache"),
            "HELM_CONFIG_HOME": str(root / "helm-config"),
            "HELM_DATA_HOME": str(root / "helm-data"),
        }
        self.admin = k8s_config.new_client_from_config(config_file=str(local.kubeconfig))
        self.core = k8s.CoreV1Api(self.admin)
        self.custom = k8s.CustomObjectsApi(self.admin)
        self.rbac = k8s.RbacAuthorizationV1Api(self.admin)
        self.apps = k8s.AppsV1Api(self.admin)

    def run(self, binary: str, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [tool(binary), *args], capture_output=True, text=True, env=self.env, timeout=120, input=stdin
        )
        assert proc.returncode == 0, f"{binary} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def helm_install(self, values: dict[str, str]) -> dict[str, Any]:
        """Install (or upgrade to) the chart with these values; returns the Deployment as the server stores it."""
        self.run("helm", "upgrade", "--install", RELEASE, str(CHART), "-n", NS, "--create-namespace",
                 "--wait=false", "--reset-values", *set_args(values))  # fmt: skip
        return self.admin.sanitize_for_serialization(self.apps.read_namespaced_deployment(RELEASE, NS))

    def sa_kubeconfig(self, deployment: dict[str, Any]) -> Path:
        """A kubeconfig that authenticates as the Deployment's ServiceAccount with a TokenRequest token."""
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        )
        token = self.core.create_namespaced_service_account_token(sa, NS, request).status.token
        server = yaml.safe_load(self.local.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        path = self.root / f"kubeconfig-{sa}"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "local", "cluster": {"server": server}}],
                    "users": [{"name": sa, "user": {"token": token}}],
                    "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa}}],
                    "current-context": sa,
                }
            )
        )
        return path

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        data = self.core.read_namespaced_secret(name, namespace).data or {}
        return base64.b64decode(data[key]).decode()

    def can_i(self, sa: str, *args: str) -> str:
        """`kubectl auth can-i ... --as` the ServiceAccount: "yes" or "no"."""
        proc = subprocess.run(
            [tool("kubectl"), "auth", "can-i", *args, f"--as=system:serviceaccount:{NS}:{sa}"],
            capture_output=True, text=True, env=self.env, timeout=60,
        )  # fmt: skip
        assert proc.stdout.strip() in ("yes", "no"), proc.stdout + proc.stderr
        return proc.stdout.strip()

    def create_job(self, namespace: str, name: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "command": [str(self.stand_in)],
                "workers": {"min": 1, "max": 1},
                "checkpoint": {"volume": {"emptyDir": {}}},
                "preemption": {"gracePeriodSeconds": 10},
                "rendezvous": {"lastCallTimeoutSeconds": 1, "joinTimeoutSeconds": 60},
                # Deleting the finished job is the operator's work too (trainingjobs delete).
                "ttlSecondsAfterFinished": 1,
            },
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self, namespace: str, name: str) -> list[str]:
        found = self.core.list_namespaced_pod(namespace, label_selector=f"ftjob.dev/job-name={name}")
        return [p.metadata.name for p in found.items]

    def events(self, namespace: str, name: str) -> list[tuple[str, str, str]]:
        found = self.core.list_namespaced_event(namespace)
        return [(e.type, e.reason, e.message or "") for e in found.items if e.involved_object.name == name]

    def diagnose(self, namespace: str, name: str, operator: ChartOperator) -> Callable[[], str]:
        def describe() -> str:
            job = self.job(namespace, name)
            return (
                f"job status: {json.dumps((job or {}).get('status'), indent=1)}\n"
                f"pods: {self.pods(namespace, name)}\nevents: {self.events(namespace, name)}\n"
                f"{operator.log_tail()}"
            )

        return describe


def succeeded(job: dict[str, Any] | None) -> bool:
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Succeeded" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("chart-rbac")
    stand_in = root / "done_trainer.py"
    stand_in.write_text(DONE_TRAINER)
    with local_cluster(root / "cluster", nodes=1, spot_nodes=0) as local:
        made = Cluster(local, root, stand_in)
        # The chart puts Roles into watchNamespaces, which must exist first (the chart's README says so).
        made.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=TEAM)))
        yield made
        made.admin.close()


@pytest.fixture
def operator_for(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], ChartOperator]]:
    """Starts the operator of an installed Deployment under its ServiceAccount; stops it after the test."""
    started: list[ChartOperator] = []

    def start(deployment: dict[str, Any]) -> ChartOperator:
        op = ChartOperator(
            deployment, cluster.sa_kubeconfig(deployment), tmp_path / "operator.log", cluster.secret_value
        )
        started.append(op)
        op.start()
        return op

    try:
        yield start
    finally:
        for op in started:
            op.stop()


def read_role(cluster: Cluster, kind: str, name: str, namespace: str | None) -> Any:
    if kind == "ClusterRole":
        return cluster.rbac.read_cluster_role(name)
    return cluster.rbac.read_namespaced_role(name, namespace)


def replace_role(cluster: Cluster, kind: str, name: str, namespace: str | None, role: Any) -> None:
    if kind == "ClusterRole":
        cluster.rbac.replace_cluster_role(name, role)
    else:
        cluster.rbac.replace_namespaced_role(name, namespace, role)


@contextlib.contextmanager
def verb_removed(
    cluster: Cluster, kind: str, name: str, namespace: str | None, resource: str, verb: str
) -> Iterator[None]:
    """One verb taken out of the rule on `resource` of an installed (Cluster)Role, put back afterwards."""
    role = read_role(cluster, kind, name, namespace)
    original = [list(r.verbs) for r in role.rules]
    rules = [r for r in role.rules if resource in r.resources]
    assert len(rules) == 1 and verb in rules[0].verbs, f"{kind} {name} has no rule with {resource} {verb}"
    rules[0].verbs = [v for v in rules[0].verbs if v != verb]
    replace_role(cluster, kind, name, namespace, role)
    try:
        yield
    finally:
        role = read_role(cluster, kind, name, namespace)
        for rule, verbs in zip(role.rules, original, strict=True):
            rule.verbs = verbs
        replace_role(cluster, kind, name, namespace, role)


def run_to_success(cluster: Cluster, op: ChartOperator, namespace: str, name: str) -> None:
    describe = cluster.diagnose(namespace, name, op)
    cluster.create_job(namespace, name)
    wait_until(
        lambda: succeeded(cluster.job(namespace, name)),
        90,
        f"{namespace}/{name} Succeeded",
        diagnose=describe,
    )
    # ttlSecondsAfterFinished: the operator deletes the job (and its Secret, Service and pods go with it).
    wait_until(
        lambda: cluster.job(namespace, name) is None, 30, "the TTL to delete the job", diagnose=describe
    )
    assert op.forbidden_lines() == [], "the chart's RBAC lacks a verb the operator used:\n" + "\n".join(
        op.forbidden_lines()
    )


def fails_with_403(cluster: Cluster, op: ChartOperator, namespace: str, name: str, missing: str) -> None:
    """The job is refused where the verb is missing: 403 in the operator's log and an ApiError event, no success."""
    describe = cluster.diagnose(namespace, name, op)
    cluster.create_job(namespace, name)
    wait_until(
        lambda: any(missing in line for line in op.forbidden_lines()),
        60,
        f"a 403 on {missing}",
        diagnose=describe,
    )
    wait_until(
        lambda: any(
            type_ == "Warning" and reason == "ApiError" and missing in message
            for type_, reason, message in cluster.events(namespace, name)
        ),
        30,
        "the operator's Warning event about the 403",
        diagnose=describe,
    )
    assert not succeeded(cluster.job(namespace, name)), describe()


# --- tests -------------------------------------------------------------------------------------------------------
def test_sa_token_is_held_to_the_charts_rbac(cluster):
    """The operator's credentials are really the chart's: what the chart does not grant is refused."""
    deployment = cluster.helm_install({})
    sa_client = k8s_config.new_client_from_config(config_file=str(cluster.sa_kubeconfig(deployment)))
    sa_core = k8s.CoreV1Api(sa_client)
    try:
        assert sa_core.list_namespaced_pod("default").items is not None  # granted in the managed namespace
        with pytest.raises(ApiException) as refused:
            sa_core.list_namespaced_config_map(NS)  # never granted
        with pytest.raises(ApiException) as elsewhere:
            sa_core.list_pod_for_all_namespaces()  # only the managed namespaces, by default
    finally:
        sa_client.close()
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403 and 'cannot list resource "configmaps"' in message, message
    assert elsewhere.value.status == 403


@pytest.mark.parametrize("scenario", ["defaults", "ha-cluster-wide"])
def test_the_operator_reads_no_secret_and_creates_no_pod_where_it_does_not_manage(cluster, scenario):
    """kubectl auth can-i, as the ServiceAccount: no Secret can be read anywhere, not even with clusterWide; by
    default a pod can be created only in the managed namespace."""
    values, _ = INSTALLS[scenario]
    sa = cluster.helm_install(values)["spec"]["template"]["spec"]["serviceAccountName"]
    for ns in ("kube-system", "default", NS):
        for verb in ("get", "list", "watch"):
            assert cluster.can_i(sa, verb, "secrets", "-n", ns) == "no", (verb, ns)
    assert cluster.can_i(sa, "create", "secrets", "-n", "default") == "yes"
    assert cluster.can_i(sa, "create", "pods", "-n", "default") == "yes"
    unmanaged = "yes" if values.get("clusterWide") == "true" else "no"
    assert cluster.can_i(sa, "create", "pods", "-n", TEAM) == unmanaged
    assert cluster.can_i(sa, "create", "pods", "-n", "kube-system") == unmanaged


@pytest.mark.parametrize("scenario", sorted(INSTALLS))
def test_installed_operator_runs_a_job_to_success_with_no_403(cluster, operator_for, scenario):
    values, namespace = INSTALLS[scenario]
    deployment = cluster.helm_install(values)
    cluster_roles = {r.metadata.name for r in cluster.rbac.list_cluster_role().items}
    assert (RELEASE in cluster_roles) == (values.get("clusterWide") == "true"), (
        "only clusterWide grants pods, secrets and jobs through a ClusterRole"
    )
    op = operator_for(deployment)
    watched = [a.split("=", 1)[1] for a in op.args if a.startswith("--namespace=")]
    assert watched == ([] if values.get("clusterWide") == "true" else [namespace]), op.args
    assert any(a.startswith("--peering=") for a in op.args) == (values.get("peering.enabled") == "true")
    run_to_success(cluster, op, namespace, f"ok-{scenario}")


@pytest.mark.parametrize("scenario", sorted(MISSING_VERBS))
def test_a_verb_missing_from_the_chart_fails_the_job_with_403(cluster, operator_for, scenario):
    install, (kind, resource, verb), missing = MISSING_VERBS[scenario]
    values, namespace = INSTALLS[install]
    deployment = cluster.helm_install(values)
    role_namespace = namespace if kind == "Role" else None
    with verb_removed(cluster, kind, RELEASE, role_namespace, resource, verb):
        op = operator_for(deployment)
        fails_with_403(cluster, op, namespace, f"missing-{scenario}", missing)
        if (resource, verb) == ("pods", "create"):
            assert cluster.pods(namespace, f"missing-{scenario}") == []
