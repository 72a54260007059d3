"""The service proxy enforces the job's NetworkPolicy with real sockets and real client processes: through the
Service and at the pod IP, a worker of the job reaches the coordinator's store port, a pod of another job is closed
at once, a process of no pod (the node) is let through; a pod no policy selects is open to all."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading

import pytest
from ftjob_local.netproxy import ServiceProxy
from ftjob_local.objects import own_ip
from ftjob_local.procs import MARKER_ENV
from ftjob_operator import network_policy, render
from ftjob_trainer.contract import RDZV_PORT
from support.wait import wait_until

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")

NS = "team-a"

# Connects, sends a line, prints what came back: 'open' (the echo), 'closed' (closed by the other side) or 'silent'.
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
        s.sendall(b"ping")
        print("open" if s.recv(4) == b"ping" else "closed")
except (ConnectionResetError, BrokenPipeError):
    print("closed")
except TimeoutError:
    print("silent")
"""


class Static:
    """An informer's read side over fixed objects (what ServiceProxy reads of client.Informer)."""

    def __init__(self, objs: list[dict]):
        self.objs, self.listeners = objs, []

    def items(self) -> list[dict]:
        return list(self.objs)

    def get(self, namespace: str, name: str) -> dict | None:
        return next(
            (
                o
                for o in self.objs
                if (o["metadata"]["namespace"], o["metadata"]["name"]) == (namespace, name)
            ),
            None,
        )


def pod(name: str, labels: dict, ip: str, ports: list[int] = ()) -> dict:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": labels},
        "spec": {"containers": [{"name": "c", "ports": [{"containerPort": p} for p in ports]}]},
        "status": {"podIP": ip, "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def service(name: str, ip: str, selector: dict) -> dict:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterIP": ip, "selector": selector, "ports": [{"name": "rdzv", "port": RDZV_PORT}]},
    }


def echo_server(host: str) -> socket.socket:
    listener = socket.create_server((host, RDZV_PORT))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(4))

    threading.Thread(target=serve, daemon=True).start()
    return listener


def connect(host: str, uid: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
    if uid:
        env[MARKER_ENV] = f"{uid}/c/0123abcd"
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, host, str(RDZV_PORT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip() or out.stderr


@pytest.fixture
def cluster():
    n = random.randrange(1, 250)  # addresses of their own: other local clusters may run on this machine
    coord_ip, plain_ip = f"127.10.251.{n}", f"127.10.252.{n}"
    coord = pod(
        "a-coordinator-0",
        {render.LABEL_JOB_NAME: "a", render.LABEL_ROLE: render.ROLE_COORDINATOR},
        coord_ip,
        [RDZV_PORT],
    )
    plain = pod("db", {"app": "db"}, plain_ip)
    pods = [
        coord,
        plain,
        pod("a-worker-1", {render.LABEL_JOB_NAME: "a", render.LABEL_ROLE: "worker"}, "127.10.253.1"),
        pod("b-worker-1", {render.LABEL_JOB_NAME: "b", render.LABEL_ROLE: "worker"}, "127.10.253.2"),
    ]
    services = [
        service("a-coordinator", f"127.96.251.{n}", coord["metadata"]["labels"]),
        service("db", f"127.96.252.{n}", {"app": "db"}),
    ]
    policy = network_policy.render_network_policy(render.JobRef("a", NS, "uid-a"), None)
    servers = [echo_server(own_ip(coord, coord_ip)), echo_server(plain_ip)]
    proxy = ServiceProxy(Static(services), Static(pods), Static([policy]), Static([])).start()
    wanted = {(f"127.96.251.{n}", RDZV_PORT), (f"127.96.252.{n}", RDZV_PORT), (coord_ip, RDZV_PORT)}
    try:
        wait_until(lambda: wanted <= set(proxy.listening()), 10, "the proxy to listen")
        yield {"service": f"127.96.251.{n}", "pod": coord_ip, "plain": f"127.96.252.{n}"}
    finally:
        proxy.stop()
        for s in servers:
            # shutdown wakes the thread blocked in accept(); close alone leaves the port bound until it returns,
            # and a later test that draws the same address fails with EADDRINUSE
            s.shutdown(socket.SHUT_RDWR)
            s.close()


def test_the_coordinator_declares_its_port_so_its_pod_ip_belongs_to_the_proxy(cluster):
    assert own_ip(pod("x", {}, "127.10.3.4", [RDZV_PORT]), "127.10.3.4") == "127.11.3.4"
    assert (
        own_ip(pod("x", {}, "127.10.3.4"), "127.10.3.4") == "127.10.3.4"
    )  # no declared port: binds its pod IP


@pytest.mark.parametrize("path", ["service", "pod"])
@pytest.mark.parametrize(
    "source, seen",
    [("uid-a-worker-1", "open"), ("uid-b-worker-1", "closed"), ("uid-db", "closed"), (None, "open")],
)
def test_the_coordinator_admits_only_its_own_job_and_the_node(cluster, path, source, seen):
    assert connect(cluster[path], source) == seen


def test_a_pod_no_policy_selects_is_open_to_every_pod(cluster):
    assert connect(cluster["plain"], "uid-b-worker-1") == "open"


def test_the_proxy_takes_a_pod_ip_port_only_once_the_pod_is_ready():
    """Until then the pod's own process may take it (one listening on 0.0.0.0 keeps it, unchecked); a pod that
    declares no port keeps its pod IP to itself."""
    n = random.randrange(1, 250)
    ip = f"127.10.254.{n}"
    starting = pod("web", {"app": "web"}, ip, [RDZV_PORT])
    starting["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    pods = Static([starting, pod("plain", {"app": "plain"}, f"127.10.249.{n}")])
    services = Static([service("web", f"127.96.254.{n}", {"app": "web"})])
    proxy = ServiceProxy(services, pods, Static([]), Static([])).start()
    try:
        # a sync binds pod IPs before Services: the Service's listener alone means the pod IP's was not wanted
        wait_until(
            lambda: proxy.listening() == [(f"127.96.254.{n}", RDZV_PORT)], 10, "the Service's listener"
        )
        starting["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        for notify in pods.listeners:
            notify("MODIFIED", starting)
        wait_until(lambda: (ip, RDZV_PORT) in proxy.listening(), 10, "the pod IP's listener")
        assert len(proxy.listening()) == 2
    finally:
        proxy.stop()
