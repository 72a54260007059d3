"""The node agent against the real local API server: scheduling, the process kubelet, the service proxy.

One cluster (API server + node agent, no operator) is started for the module with `LocalCluster.up`, as
`ftjob local up --no-operator` does, and stopped at the end.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from ftjob_local.client import Kube
from support.cluster import local_cluster
from support.wait import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ftjob_local.apiserver.__main__") is None,
        reason="the local API server (ftjob_local.apiserver) is not in this build yet",
    ),
]
NS = "default"
PY = sys.executable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_cluster(tmp_path_factory.mktemp("cluster"), nodes=1, spot_nodes=1) as c:
        yield c


@pytest.fixture(scope="module")
def kube(cluster):
    return Kube(str(cluster.kubeconfig))


def kubectl(cluster, *args, check=True) -> subprocess.CompletedProcess:
    exe = Path(PY).parent / "kubectl"
    return subprocess.run(
        [str(exe), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def make_pod(kube: Kube, pod_name: str, command: list[str], **spec) -> dict:
    container = {"name": "main", "image": "python:3.12", "command": command}
    container.update(spec.pop("container", {}))
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "labels": spec.pop("labels", {})},
        "spec": {"restartPolicy": spec.pop("restartPolicy", "Never"), "containers": [container], **spec},
    }
    return kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)


def get_pod(kube: Kube, pod_name: str) -> dict | None:
    return kube.get(f"/api/v1/namespaces/{NS}/pods/{pod_name}")


def phase_is(kube: Kube, pod_name: str, *phases: str):
    def check():
        pod = get_pod(kube, pod_name)
        return pod if pod and (pod.get("status") or {}).get("phase") in phases else None

    return check


def events_for(kube: Kube, pod_name: str) -> list[dict]:
    items = kube.request("GET", f"/api/v1/namespaces/{NS}/events").get("items") or []
    return [e for e in items if (e.get("involvedObject") or {}).get("name") == pod_name]


def cond(pod: dict, ctype: str) -> dict:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def test_nodes_registered_with_capacity_and_spot_label(kube):
    nodes = {n["metadata"]["name"]: n for n in kube.request("GET", "/api/v1/nodes")["items"]}
    assert {"local-node-0", "local-spot-0"} <= set(nodes)
    spot = nodes["local-spot-0"]
    assert spot["metadata"]["labels"]["ftjob.dev/spot"] == "true"
    assert "ftjob.dev/spot" not in nodes["local-node-0"]["metadata"]["labels"]
    assert cond(spot, "Ready")["status"] == "True"
    assert set(spot["status"]["capacity"]) >= {"cpu", "memory", "pods", "nvidia.com/gpu"}


def test_scheduling_selectors_taints_and_resources(kube, cluster):
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    spot = name("spot")
    make_pod(kube, spot, sleep, nodeSelector={"ftjob.dev/spot": "true"}, terminationGracePeriodSeconds=0)
    big = name("big")
    make_pod(kube, big, sleep, container={"resources": {"requests": {"cpu": "1000"}}})
    gpu = name("gpu")
    make_pod(kube, gpu, sleep, container={"resources": {"limits": {"nvidia.com/gpu": "1"}}})
    pod = wait_until(
        lambda: (get_pod(kube, spot) or {}).get("spec", {}).get("nodeName"), 20, what="spot binding"
    )
    assert pod == "local-spot-0"
    for pending, why in ((big, "Insufficient cpu"), (gpu, "Insufficient nvidia.com/gpu")):
        p = wait_until(
            lambda n=pending: (lambda x: x if cond(x, "PodScheduled").get("status") == "False" else None)(
                get_pod(kube, n)
            ),
            20,
            what=f"{pending} unschedulable",
        )
        assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
        assert cond(p, "PodScheduled")["reason"] == "Unschedulable"
        assert why in cond(p, "PodScheduled")["message"]
        ev = wait_until(
            lambda n=pending: [e for e in events_for(kube, n) if e["reason"] == "FailedScheduling"],
            10,
            what="FailedScheduling event",
        )
        assert why in ev[0]["message"] and ev[0]["type"] == "Warning"

    # A NoSchedule taint keeps pods without a toleration away; a toleration lets them in.
    kubectl(cluster, "taint", "node", "local-node-0", "example.com/maintenance=yes:NoSchedule")
    try:
        pinned = {"kubernetes.io/hostname": "local-node-0"}
        refused, tolerant = name("refused"), name("tolerant")
        make_pod(kube, refused, sleep, nodeSelector=pinned)
        make_pod(
            kube,
            tolerant,
            sleep,
            nodeSelector=pinned,
            terminationGracePeriodSeconds=0,
            tolerations=[{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}],
        )
        assert (
            wait_until(
                lambda: (get_pod(kube, tolerant) or {}).get("spec", {}).get("nodeName"),
                20,
                what="tolerant binding",
            )
            == "local-node-0"
        )
        p = wait_until(
            lambda: (lambda x: x if cond(x, "PodScheduled").get("status") == "False" else None)(
                get_pod(kube, refused)
            ),
            20,
            what="refused unschedulable",
        )
        assert "untolerated taint {example.com/maintenance: yes}" in cond(p, "PodScheduled")["message"]
    finally:
        kubectl(cluster, "taint", "node", "local-node-0", "example.com/maintenance-")
    # Once the taint is gone the pending pod is scheduled.
    assert (
        wait_until(
            lambda: (get_pod(kube, refused) or {}).get("spec", {}).get("nodeName"),
            20,
            what="binding after untaint",
        )
        == "local-node-0"
    )
    for n in (spot, big, gpu, refused, tolerant):
        kubectl(cluster, "delete", "pod", n, "--grace-period=0", "--force", "--wait=false", check=False)


def test_required_anti_affinity_waits_for_a_free_node_and_takes_it_when_one_comes(kube, cluster):
    """The worker pods' spread as the operator renders it: the second pod does not share the one spot node; it
    waits Unschedulable and is bound as soon as a node change gives it somewhere to go."""
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    group = {"app": name("spread")}
    term = {"labelSelector": {"matchLabels": group}, "topologyKey": "kubernetes.io/hostname"}
    spec = {
        "labels": group,
        "nodeSelector": {"ftjob.dev/spot": "true"},
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
        "terminationGracePeriodSeconds": 0,
    }
    first, second = name("first"), name("second")
    make_pod(kube, first, sleep, **spec)
    where = wait_until(
        lambda: (get_pod(kube, first) or {}).get("spec", {}).get("nodeName"), 20, "first binding"
    )
    assert where == "local-spot-0"
    make_pod(kube, second, sleep, **spec)
    try:
        p = wait_until(
            lambda: (lambda x: x if cond(x, "PodScheduled").get("status") == "False" else None)(
                get_pod(kube, second)
            ),
            20,
            what="second unschedulable",
        )
        assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
        assert cond(p, "PodScheduled")["reason"] == "Unschedulable"
        assert cond(p, "PodScheduled")["message"] == (
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
            "1 node(s) didn't match pod anti-affinity rules."
        )
        kubectl(cluster, "label", "node", "local-node-0", "ftjob.dev/spot=true")
        where = wait_until(
            lambda: (get_pod(kube, second) or {}).get("spec", {}).get("nodeName"), 20, "second binding"
        )
        assert where == "local-node-0"
    finally:
        kubectl(cluster, "label", "node", "local-node-0", "ftjob.dev/spot-", check=False)
        for n in (first, second):
            kubectl(cluster, "delete", "pod", n, "--grace-period=0", "--force", "--wait=false", check=False)


SCRIPT = r"""
import json, os, sys
print(json.dumps({k: os.environ.get(k) for k in sorted(os.environ) if k.startswith("T_")}))
print("argv", json.dumps(sys.argv[1:]))
print("cwd", os.getcwd())
with open("/data/out.txt", "w") as f:
    f.write("volume ok")
with open("/dev/termination-log", "w") as f:
    f.write("bye from " + os.environ["T_NAME"])
sys.exit(3)
"""


def test_pod_env_volumes_termination_message_exit_code_and_logs(kube, cluster):
    secret = name("sec")
    kube.request(
        "POST",
        f"/api/v1/namespaces/{NS}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret},
            "data": {"token": base64.b64encode(b"s3cret").decode()},
        },
    )
    cm = name("cm")
    kube.request(
        "POST",
        f"/api/v1/namespaces/{NS}/configmaps",
        body={
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": cm},
            "data": {"mode": "fast", "level": "3"},
        },
    )
    pod_name = name("envpod")
    env = [
        {"name": "T_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "T_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "T_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "T_APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "T_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "T_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "T_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "T_SECRET", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}},
        {"name": "T_MODE", "valueFrom": {"configMapKeyRef": {"name": cm, "key": "mode"}}},
        {"name": "T_ADDR", "value": "$(T_IP):29400"},
        {"name": "T_ESCAPED", "value": "$$(T_IP)"},
        {"name": "T_DIR", "value": "/data/sub"},
    ]
    created = make_pod(
        kube,
        pod_name,
        [PY, "-c", SCRIPT],
        labels={"app": "demo"},
        volumes=[{"name": "data", "emptyDir": {}}],
        container={
            "args": ["--addr=$(T_ADDR)", "$(T_MISSING)"],
            "env": env,
            "envFrom": [{"prefix": "T_CM_", "configMapRef": {"name": cm}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "workingDir": "/data/work",
        },
    )
    uid = created["metadata"]["uid"]
    pod = wait_until(phase_is(kube, pod_name, "Failed", "Succeeded"), 30, what="pod to finish")
    assert pod["status"]["phase"] == "Failed"
    (status,) = pod["status"]["containerStatuses"]
    term = status["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    assert term["message"] == f"bye from {pod_name}"
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.10.") and pod["status"]["podIPs"] == [{"ip": ip}]

    logs = kubectl(cluster, "logs", pod_name).stdout.splitlines()
    seen = json.loads(logs[0])
    backing = cluster.dir / "pods" / uid / "volumes" / "data"
    assert seen == {
        "T_NAME": pod_name,
        "T_NS": NS,
        "T_UID": uid,
        "T_APP": "demo",
        "T_NODE": pod["spec"]["nodeName"],
        "T_IP": ip,
        "T_HOST": "127.0.0.1",
        "T_SECRET": "s3cret",
        "T_MODE": "fast",
        "T_ADDR": f"{ip}:29400",
        "T_ESCAPED": "$(T_IP)",
        "T_DIR": f"{backing}/sub",
        "T_CM_mode": "fast",
        "T_CM_level": "3",
    }
    assert logs[1] == "argv " + json.dumps([f"--addr={ip}:29400", "$(T_MISSING)"])
    assert logs[2] == f"cwd {backing}/work"
    assert (backing / "out.txt").read_text() == "volume ok"
    reasons = {e["reason"] for e in events_for(kube, pod_name)}
    assert {"Scheduled", "LocalEmulation", "Started"} <= reasons
    emulation = next(e for e in events_for(kube, pod_name) if e["reason"] == "LocalEmulation")
    assert "image" in emulation["message"].lower() and "/data -> " in emulation["message"]


def test_missing_secret_waits_with_a_clear_reason(kube, cluster):
    pod_name = name("nosecret")
    make_pod(
        kube,
        pod_name,
        [PY, "-c", "print('started')"],
        container={
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "does-not-exist", "key": "k"}}}]
        },
    )
    pod = wait_until(
        lambda: (
            lambda p: (
                p
                if ((p or {}).get("status", {}).get("containerStatuses") or [{}])[0]
                .get("state", {})
                .get("waiting", {})
                .get("reason")
                == "CreateContainerConfigError"
                else None
            )
        )(get_pod(kube, pod_name)),
        20,
        what="CreateContainerConfigError",
    )
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert 'secret "does-not-exist" not found' in waiting["message"]
    assert pod["status"]["phase"] == "Pending"
    kubectl(cluster, "delete", "pod", pod_name, "--wait=true", "--timeout=30s")
    assert get_pod(kube, pod_name) is None


def test_restart_policy_on_failure_counts_restarts(kube, tmp_path):
    counter = tmp_path / "runs"
    pod_name = name("flaky")
    code = (
        f"import sys, pathlib; p = pathlib.Path({str(counter)!r}); n = int(p.read_text()) if p.exists() else 0;"
        " p.write_text(str(n + 1)); sys.exit(0 if n >= 1 else 7)"
    )
    make_pod(kube, pod_name, [PY, "-c", code], restartPolicy="OnFailure")
    pod = wait_until(phase_is(kube, pod_name, "Succeeded", "Failed"), 30, what="flaky pod to finish")
    assert pod["status"]["phase"] == "Succeeded"
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 7
    assert status["state"]["terminated"]["reason"] == "Completed"
    assert counter.read_text() == "2"


def test_init_container_then_always_restart_with_previous_logs(kube, cluster):
    """Init containers run first, to completion; restartPolicy Always restarts the main container and
    `kubectl logs --previous` shows the run before."""
    pod_name = name("looper")
    init = {
        "name": "prepare",
        "image": "busybox",
        "command": [PY, "-c", "open('/work/seed', 'w').write('seeded')"],
        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
    }
    code = (
        "import pathlib, sys; p = pathlib.Path('/work/seed'); n = len(p.read_text()); "
        "p.write_text(p.read_text() + '+'); print('run', n - 6, flush=True); sys.exit(1)"
    )
    make_pod(
        kube,
        pod_name,
        [PY, "-c", code],
        restartPolicy="Always",
        initContainers=[init],
        terminationGracePeriodSeconds=0,
        volumes=[{"name": "work", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "work", "mountPath": "/work"}]},
    )

    def restarted():
        p = get_pod(kube, pod_name)
        statuses = (p or {}).get("status", {}).get("containerStatuses") or [{}]
        return p if statuses[0].get("restartCount", 0) >= 2 else None

    pod = wait_until(restarted, 30, what="two restarts")
    (init_status,) = pod["status"]["initContainerStatuses"]
    assert init_status["state"]["terminated"]["exitCode"] == 0
    assert cond(pod, "Initialized")["status"] == "True"
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 1
    previous = kubectl(cluster, "logs", pod_name, "--previous").stdout
    current = kubectl(cluster, "logs", pod_name).stdout
    runs = [int(line.split()[1]) for line in (previous + current).splitlines() if line.startswith("run")]
    assert runs and runs[0] >= 0 and runs == sorted(runs)
    assert kubectl(cluster, "logs", pod_name, "-c", "prepare").stdout == ""
    kubectl(cluster, "delete", "pod", pod_name, "--wait=true", "--timeout=30s")


TERM_IGNORER = r"""
import signal, sys, time, pathlib
marker = pathlib.Path(sys.argv[1])
def on_term(signum, frame):
    marker.write_text("TERM")
    print("got SIGTERM", flush=True)
signal.signal(signal.SIGTERM, on_term)
marker.write_text("started")
while True:
    time.sleep(0.05)
"""


def test_graceful_deletion_sigterm_then_sigkill_after_grace(kube, cluster, tmp_path):
    marker = tmp_path / "marker"
    pod_name = name("stubborn")
    created = make_pod(kube, pod_name, [PY, "-c", TERM_IGNORER, str(marker)], terminationGracePeriodSeconds=2)
    wait_until(phase_is(kube, pod_name, "Running"), 30, what="pod running")
    wait_until(lambda: marker.exists() and marker.read_text() == "started", 10, what="process started")
    pid_file = cluster.dir / "pods" / created["metadata"]["uid"] / "containers" / "main" / "pid"
    pid = int(pid_file.read_text().split()[0])
    t0 = time.monotonic()
    kubectl(cluster, "delete", "pod", pod_name, "--wait=false")
    wait_until(lambda: marker.read_text() == "TERM", 10, what="SIGTERM to reach the process")
    pod = get_pod(kube, pod_name)
    assert pod is None or pod["metadata"].get("deletionTimestamp")  # graceful: still there while it runs
    wait_until(lambda: get_pod(kube, pod_name) is None, 20, what="pod object gone")
    elapsed = time.monotonic() - t0
    assert 1.8 <= elapsed < 10, (
        f"the process ignored SIGTERM, so SIGKILL should come after the 2s grace ({elapsed:.1f}s)"
    )
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    # A process that exits on SIGTERM ends the pod at once, long before its 30 s grace period.
    quick = name("quick")
    make_pod(kube, quick, [PY, "-c", "import time; time.sleep(60)"])
    wait_until(phase_is(kube, quick, "Running"), 30, what="quick pod running")
    t0 = time.monotonic()
    kubectl(cluster, "delete", "pod", quick, "--wait=true", "--timeout=30s")
    assert time.monotonic() - t0 < 10


def test_liveness_probe_failure_restarts_the_container(kube, cluster):
    pod_name = name("unhealthy")
    make_pod(
        kube,
        pod_name,
        [PY, "-c", "import time; time.sleep(60)"],
        restartPolicy="OnFailure",
        terminationGracePeriodSeconds=0,
        container={
            "livenessProbe": {
                "exec": {"command": [PY, "-c", "raise SystemExit(1)"]},
                "periodSeconds": 1,
                "failureThreshold": 2,
            }
        },
    )

    def restarted():
        p = get_pod(kube, pod_name)
        s = ((p or {}).get("status", {}).get("containerStatuses") or [{}])[0]
        return s if s.get("restartCount", 0) >= 1 else None

    status = wait_until(restarted, 30, what="a restart after the liveness probe failed")
    assert status["lastState"]["terminated"]["exitCode"] == 137
    assert any(e["reason"] == "Unhealthy" for e in events_for(kube, pod_name))
    kubectl(cluster, "delete", "pod", pod_name, "--wait=true", "--timeout=30s")


HTTP_SERVER = r"""
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from " + os.environ["POD_NAME"]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
"""


def test_service_proxy_forwards_to_ready_pod(kube, cluster):
    app = name("web")
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    make_pod(
        kube,
        app,
        [PY, "-c", HTTP_SERVER],
        labels={"app": app},
        terminationGracePeriodSeconds=1,
        container={
            "env": env,
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        },
    )
    svc = kube.request(
        "POST",
        f"/api/v1/namespaces/{NS}/services",
        body={
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": app},
            "spec": {"selector": {"app": app}, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]},
        },
    )
    ip = svc["spec"]["clusterIP"]
    assert ip.startswith("127.96.")
    pod = wait_until(
        lambda: (lambda p: p if cond(p or {}, "Ready").get("status") == "True" else None)(get_pod(kube, app)),
        30,
        what="web pod ready",
    )
    assert pod["status"]["containerStatuses"][0]["ready"] is True

    def fetch():
        try:
            with urllib.request.urlopen(f"http://{ip}:80/", timeout=2) as resp:
                return resp.read().decode()
        except OSError:
            return None

    assert wait_until(fetch, 20, what="service answer") == f"hello from {app}"
    kubectl(cluster, "delete", "service", app)
    kubectl(cluster, "delete", "pod", app, "--wait=true", "--timeout=30s")


def test_node_deletion_kills_its_pods(kube, cluster, tmp_path):
    """Pod GC: deleting a node kills its pods' processes and deletes the pods (the node is re-registered)."""
    pod_name = name("orphan")
    created = make_pod(
        kube,
        pod_name,
        [PY, "-c", "import time; time.sleep(120)"],
        nodeSelector={"kubernetes.io/hostname": "local-node-0"},
    )
    wait_until(phase_is(kube, pod_name, "Running"), 30, what="pod running")
    pid_file = cluster.dir / "pods" / created["metadata"]["uid"] / "containers" / "main" / "pid"
    pid = int(pid_file.read_text().split()[0])
    kubectl(cluster, "delete", "node", "local-node-0")
    wait_until(lambda: get_pod(kube, pod_name) is None, 20, what="pod deleted with its node")

    def dead():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(dead, 10, what="process killed")


def test_pods_keep_running_across_an_api_server_restart(kube, cluster, tmp_path):
    """The node agent re-lists after the control plane comes back: running pods continue, new pods run."""
    marker = tmp_path / "ticks"
    pod_name = name("steady")
    # The pod writes each tick to a side file and renames it over the marker, so a read never sees the
    # marker truncated and empty (write_text truncates first: CI read '' once).
    code = (
        f"import os, time, pathlib\nn = 0\nwhile True:\n    n += 1; pathlib.Path({str(marker)!r} + '.tmp').write_text(str(n));"
        f" os.replace({str(marker)!r} + '.tmp', {str(marker)!r}); time.sleep(0.1)"
    )
    created = make_pod(
        kube,
        pod_name,
        [PY, "-c", code],
        terminationGracePeriodSeconds=1,
        nodeSelector={"kubernetes.io/hostname": "local-spot-0"},
    )
    wait_until(phase_is(kube, pod_name, "Running"), 30, what="pod running")
    pid_file = cluster.dir / "pods" / created["metadata"]["uid"] / "containers" / "main" / "pid"
    pid = int(pid_file.read_text().split()[0])
    cluster.down(only=["apiserver"], say=lambda *_: None)
    tick = int(marker.read_text())
    wait_until(
        lambda: int(marker.read_text()) > tick + 3, 10, what="the pod to go on while the API server is down"
    )
    cluster.restart("apiserver")
    os.kill(pid, 0)  # the process was never touched
    assert get_pod(kube, pod_name)["status"]["phase"] == "Running"
    after = name("after")
    make_pod(kube, after, [PY, "-c", "print('after restart')"])
    wait_until(phase_is(kube, after, "Succeeded"), 30, what="a new pod after the restart")
    kubectl(cluster, "delete", "pod", pod_name, "--wait=true", "--timeout=30s")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
