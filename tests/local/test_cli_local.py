"""`ftjob local up|status|restart|preempt|down` end to end: preemption with notice and --hard, pods that outlive
every component's restart, operators started by hand, nothing left running."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from ftjob_local import records
from ftjob_local.cli import main
from ftjob_local.client import Kube
from ftjob_local.cluster import LocalCluster
from ftjob_local.procs import running
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
SPOT_TAINT = "aws-node-termination-handler/spot-itn"

# Records SIGTERM in a marker file, takes a moment (as a checkpoint save would), then exits 0.
SAVER = r"""
import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
marker.write_text("running")
while not stop:
    time.sleep(0.02)
marker.write_text("TERM")
time.sleep(1.0)
marker.write_text("saved")
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent, this test process) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def cluster(tmp_path, capsys):
    state = tmp_path / "state"
    assert main(["up", "--state-dir", str(state), "--nodes", "1", "--spot-nodes", "2", "--no-operator"]) == 0
    out = capsys.readouterr().out
    assert f"export KUBECONFIG={state.resolve() / 'kubeconfig'}" in out
    c = LocalCluster(state)
    try:
        yield c
    finally:
        c.down(say=lambda *_: None)


def spot_pod(kube: Kube, node: str, marker, grace: int = 10) -> dict:
    name = f"w-{uuid.uuid4().hex[:6]}"
    return kube.request(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": grace,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [
                    {"name": "main", "image": "trainer", "command": [PY, "-c", SAVER, str(marker)]}
                ],
            },
        },
    )


def pod_pid(cluster: LocalCluster, pod: dict) -> int:
    f = cluster.dir / "pods" / pod["metadata"]["uid"] / "containers" / "main" / "pid"
    return int(wait_until(lambda: f.exists() and f.read_text(), 10, what="pid file").split()[0])


def node_names(kube: Kube) -> set[str]:
    return {n["metadata"]["name"] for n in kube.request("GET", "/api/v1/nodes")["items"]}


def test_up_status_down_leaves_nothing_running(tmp_path, capsys):
    state = tmp_path / "s"
    assert main(["up", "--state-dir", str(state), "--nodes", "1", "--spot-nodes", "1", "--no-operator"]) == 0
    c = LocalCluster(state)
    try:
        pids = [c.alive(n)["pid"] for n in ("apiserver", "node-agent")]
        kube = Kube(str(c.kubeconfig))
        pod = spot_pod(kube, "local-spot-0", tmp_path / "m")
        wait_until(lambda: (tmp_path / "m").exists(), 30, what="pod process")
        pids.append(pod_pid(c, pod))
        capsys.readouterr()
        assert main(["status", "--state-dir", str(state), "--json"]) == 0
        st = json.loads(capsys.readouterr().out)
        assert st["components"]["apiserver"]["running"] and st["components"]["node-agent"]["running"]
        assert not st["components"]["operator"]["running"]
        assert {n["name"] for n in st["nodes"]} == {"local-node-0", "local-spot-0"}
        assert st["pods"] == {"Running": 1}
        # A second `up` on a running cluster starts nothing and says so.
        assert main(["up", "--state-dir", str(state), "--no-operator"]) == 0
        assert "everything already runs" in capsys.readouterr().out
        assert [c.alive(n)["pid"] for n in ("apiserver", "node-agent")] == pids[:2]
    finally:
        assert main(["down", "--state-dir", str(state)]) == 0
    assert [p for p in pids if alive(p)] == []
    assert main(["status", "--state-dir", str(state)]) == 3
    assert "stopped" in capsys.readouterr().out


def test_preempt_with_notice(cluster, tmp_path, capsys):
    kube = Kube(str(cluster.kubeconfig))
    marker = tmp_path / "marker"
    pod = spot_pod(kube, "local-spot-0", marker)
    name = pod["metadata"]["name"]
    wait_until(lambda: marker.exists(), 30, what="pod process")
    pid = pod_pid(cluster, pod)
    t0 = time.monotonic()
    assert (
        main(["preempt", str(cluster.dir), "local-spot-0", "--notice", "1.5", "--replace-after", "0.5"]) == 0
    )
    assert time.monotonic() - t0 < 5, "preempt returns at once unless --wait"
    node = kube.get("/api/v1/nodes/local-spot-0")
    assert any(t["key"] == SPOT_TAINT and t["effect"] == "NoSchedule" for t in node["spec"]["taints"])
    # During the notice the pod keeps running, without DisruptionTarget.
    p = kube.get(f"/api/v1/namespaces/{NS}/pods/{name}")
    assert not any(c["type"] == "DisruptionTarget" for c in p["status"].get("conditions") or [])
    assert marker.read_text() == "running"

    def disrupted():
        p = kube.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        c = next(
            (
                c
                for c in (p or {}).get("status", {}).get("conditions") or []
                if c["type"] == "DisruptionTarget"
            ),
            None,
        )
        return (p, c) if c else None

    p, c = wait_until(disrupted, 10, interval=0.05, what="DisruptionTarget")
    assert time.monotonic() - t0 >= 1.4
    assert c["status"] == "True" and c["reason"] == "TerminationByKubelet"

    # The condition is set just before the graceful delete (as the kubelet does): wait for the delete to land.
    def deleting():
        p = kube.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        return p is None or bool(p["metadata"].get("deletionTimestamp"))

    wait_until(deleting, 10, interval=0.05, what="deletionTimestamp after DisruptionTarget")
    wait_until(lambda: marker.read_text() in ("TERM", "saved"), 10, what="SIGTERM in the pod")
    wait_until(lambda: "local-spot-0" not in node_names(kube), 20, what="node removed")
    assert marker.read_text() == "saved", "the process had its grace period to finish"
    assert kube.get(f"/api/v1/namespaces/{NS}/pods/{name}") is None
    assert not alive(pid)
    replacement = wait_until(
        lambda: node_names(kube) - {"local-node-0", "local-spot-0", "local-spot-1"},
        20,
        what="replacement node",
    )
    assert replacement == {"local-spot-2"}
    fresh = kube.get("/api/v1/nodes/local-spot-2")
    assert fresh["metadata"]["labels"]["ftjob.dev/spot"] == "true"
    # The replacement runs pods.
    marker2 = tmp_path / "marker2"
    spot_pod(kube, "local-spot-2", marker2)
    wait_until(lambda: marker2.exists(), 30, what="pod on the replacement node")


def test_preempt_hard_and_wait(cluster, tmp_path, capsys):
    kube = Kube(str(cluster.kubeconfig))
    marker = tmp_path / "marker"
    pod = spot_pod(kube, "local-spot-1", marker, grace=30)
    wait_until(lambda: marker.exists(), 30, what="pod process")
    pid = pod_pid(cluster, pod)
    t0 = time.monotonic()
    assert main(["preempt", "--state-dir", str(cluster.dir), "local-spot-1", "--hard", "--wait"]) == 0
    assert time.monotonic() - t0 < 10
    assert "local-spot-1 is gone" in capsys.readouterr().out
    wait_until(lambda: not alive(pid), 5, what="process killed")
    assert marker.read_text() == "running", "a hard preemption gives no SIGTERM"
    wait_until(
        lambda: kube.get(f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}") is None,
        10,
        what="pod deleted",
    )


def test_preempt_errors_say_what_to_fix(cluster, capsys):
    assert main(["preempt", str(cluster.dir), "no-such-node"]) == 1
    err = capsys.readouterr().err
    assert "node 'no-such-node' not found" in err and "local-spot-0" in err
    assert main(["preempt", str(cluster.dir), "local-spot-0", "--hard", "--notice", "5"]) == 1
    assert "--hard means no notice" in capsys.readouterr().err


def kill9(cluster: LocalCluster, name: str) -> None:
    rec = cluster.alive(name)
    os.kill(rec["pid"], signal.SIGKILL)
    wait_until(lambda: not running(rec["pid"], rec["start"]), 10, what=f"{name} to die")


def test_pods_outlive_every_component_and_up_starts_only_what_is_missing(cluster, tmp_path, capsys):
    kube = Kube(str(cluster.kubeconfig))
    marker, doomed_marker = tmp_path / "marker", tmp_path / "doomed"
    pod = spot_pod(kube, "local-spot-0", marker)
    doomed = spot_pod(kube, "local-spot-1", doomed_marker)
    wait_until(lambda: marker.exists() and doomed_marker.exists(), 30, what="pod processes")
    pid, doomed_pid = pod_pid(cluster, pod), pod_pid(cluster, doomed)
    proxy = cluster.alive("proxy")["pid"]

    # SIGKILL of the API server and the kubelet; one pod is deleted while no kubelet runs.
    kill9(cluster, "node-agent")
    kube.delete(f"/api/v1/namespaces/{NS}/pods/{doomed['metadata']['name']}", grace=0)
    kill9(cluster, "apiserver")
    assert alive(pid) and alive(doomed_pid) and marker.read_text() == "running"
    capsys.readouterr()
    assert main(["up", "--state-dir", str(cluster.dir), "--no-operator"]) == 0
    assert "starting what does not run" in capsys.readouterr().out
    assert cluster.alive("proxy")["pid"] == proxy, "what ran was left alone"

    # The restarted kubelet adopted the running pod (no signal, same process) and killed the deleted one's.
    def adopted():
        p = kube.get(f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}")
        return p and p["status"]["phase"] == "Running" and p["status"]["containerStatuses"][0]["ready"] and p

    p = wait_until(adopted, 30, what="the pod Running after the restarts")
    assert (
        p["metadata"]["uid"] == pod["metadata"]["uid"]
        and p["status"]["containerStatuses"][0]["restartCount"] == 0
    )
    wait_until(lambda: not alive(doomed_pid), 30, what="the deleted pod's process killed")
    # the kubelet removes the folder after the kill: wait for it rather than race it
    doomed_dir = cluster.dir / "pods" / doomed["metadata"]["uid"]
    wait_until(lambda: not doomed_dir.exists(), 30, what="the deleted pod's folder removed")
    assert alive(pid) and marker.read_text() == "running"

    # `restart` stops each component gracefully and starts it again; the pod still runs, untouched.
    for component in ("kubelet", "proxy", "apiserver", "all"):
        assert main(["restart", component, "--state-dir", str(cluster.dir)]) == 0
        assert alive(pid) and marker.read_text() == "running", component

    # Its end is seen by the kubelet that adopted it: a graceful delete, SIGTERM, the save, then gone.
    kube.delete(f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}")
    wait_until(lambda: not alive(pid), 30, what="the pod's process to end")
    assert marker.read_text() == "saved"


@pytest.mark.skipif(
    importlib.util.find_spec("ftjob_operator.handlers") is None, reason="the operator is not in this build"
)
def test_an_operator_started_by_hand_is_known_to_status_restart_and_down(cluster, tmp_path, capsys):
    # A copy of the kubeconfig outside the state folder, as the README's chart route makes one.
    kubeconfig = tmp_path / "operator-kubeconfig"
    kubeconfig.write_text(cluster.kubeconfig.read_text())
    log = open(tmp_path / "operator.log", "wb")
    op = subprocess.Popen(
        [PY, "-m", "ftjob_operator.cli", "operator", "--kubeconfig", str(kubeconfig), "--metrics-port", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k != records.MANAGED_ENV},
    )
    try:
        name = f"operator-{op.pid}"
        wait_until(lambda: cluster.alive(name), 30, what="the operator's record")
        capsys.readouterr()
        assert main(["status", "--state-dir", str(cluster.dir), "--json"]) == 0
        st = json.loads(capsys.readouterr().out)["components"]
        assert st[name] == {"running": True, "pid": op.pid, "handStarted": True}
        assert not st["operator"]["running"]

        assert main(["restart", "operator", "--state-dir", str(cluster.dir)]) == 0
        assert op.wait(30) is not None  # the one started by hand was stopped ...
        again = cluster.alive(name)  # ... and runs again with its flags, now from the state folder
        assert again and again["pid"] != op.pid and str(kubeconfig) in again["argv"]

        assert main(["down", "--state-dir", str(cluster.dir)]) == 0
        assert f"stopped {name}" in capsys.readouterr().out
        assert not running(again["pid"], again["start"])
    finally:
        if op.poll() is None:
            op.kill()
        log.close()
