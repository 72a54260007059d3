"""The node agent against the real local API server: the process kubelet (env, volumes, termination
messages, logs, restart policies, init containers, graceful deletion, probes) and the service proxy.

One cluster (API server + node agent, no operator) is started for the module with `LocalCluster.up`, as
`ftjob local up --no-operator` does, and stopped at the end.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import time
import urllib.request

import pytest
from node_cluster_testlib import NS, PY, cond, events_for, get_pod, kubectl, make_pod, name, phase_is
from support.wait import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ftjob_local.apiserver.__main__") is None,
        reason="the local API server (ftjob_local.apiserver) is not in this build yet",
    ),
]


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
