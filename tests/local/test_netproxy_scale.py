"""The service proxy's work per event and per connection does not grow with the number of other jobs (issue 15):
with a thousand other jobs' pods, Services and NetworkPolicies present, one pod's event re-derives that pod alone,
and a connection through a Service looks at its own job's pods and policy only. Counted, not timed; the listeners
and connections are real sockets. And a stopped proxy ends the connections it still held open."""

from __future__ import annotations

import random
import socket

from ftjob_local.labelindex import LabelIndex, SelectorIndex
from ftjob_local.netproxy import ServiceProxy
from ftjob_local.objects import own_ip
from ftjob_operator import network_policy, render
from ftjob_trainer.contract import RDZV_PORT
from support.wait import wait_until
from test_netproxy_policy import echo_server

NS = "team-a"
OTHERS = 1000


class Cache:
    """An informer's read side (items, get, listeners) over a dict, as client.Informer keeps it."""

    def __init__(self, objs: list[dict]):
        self.objs = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
        self.listeners = []

    def items(self) -> list[dict]:
        return list(self.objs.values())

    def get(self, namespace: str, name: str) -> dict | None:
        return self.objs.get((namespace, name))

    def put(self, obj: dict) -> None:
        self.objs[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        for notify in self.listeners:
            notify("MODIFIED", obj)


def job_pods(job: str, coord_ip: str, worker_ip: str) -> list[dict]:
    def pod(name, role, ip, ports):
        labels = {render.LABEL_JOB_NAME: job, render.LABEL_ROLE: role}
        return {
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": [{"containerPort": p} for p in ports]}]},
            "status": {"podIP": ip, "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }

    return [
        pod(f"{job}-coordinator-0", render.ROLE_COORDINATOR, coord_ip, [RDZV_PORT]),
        pod(f"{job}-worker-1", "worker", worker_ip, []),
    ]


def job_service(job: str, ip: str) -> dict:
    selector = {render.LABEL_JOB_NAME: job, render.LABEL_ROLE: render.ROLE_COORDINATOR}
    return {
        "metadata": {"name": f"{job}-coordinator", "namespace": NS},
        "spec": {"clusterIP": ip, "selector": selector, "ports": [{"name": "rdzv", "port": RDZV_PORT}]},
    }


def test_one_event_and_one_connection_cost_the_same_beside_a_thousand_other_jobs():
    n = random.randrange(1, 250)
    coord_ip, svc_ip = f"127.10.247.{n}", f"127.96.247.{n}"
    mine = job_pods("mine", coord_ip, f"127.10.246.{n}")
    pods, services, policies = list(mine), [job_service("mine", svc_ip)], []
    for i in range(
        OTHERS
    ):  # pods that publish no port and headless Services: nothing of theirs is listened on
        other = job_pods(f"j{i}", f"127.10.{i // 200 + 100}.{i % 200 + 1}", "127.10.99.1")
        other[0]["spec"]["containers"][0]["ports"] = []
        pods += other
        services.append(job_service(f"j{i}", "None"))
    for job in ["mine"] + [f"j{i}" for i in range(OTHERS)]:
        policies.append(network_policy.render_network_policy(render.JobRef(job, NS, f"uid-{job}"), None))
    pod_cache = Cache(pods)
    listener = echo_server(own_ip(mine[0], coord_ip))
    proxy = ServiceProxy(Cache(services), pod_cache, Cache(policies), Cache([])).start()
    try:
        wanted = [(coord_ip, RDZV_PORT), (svc_ip, RDZV_PORT)]
        total = len(pods) + len(services) + len(policies)
        wait_until(lambda: proxy.claims_derived >= total, 20, "the proxy to read every object")
        wait_until(lambda: proxy.listening() == sorted(wanted), 20, "the proxy to listen for the one job")
        assert proxy.claims_derived == total  # each object once

        # A worker turns not ready: only that pod is looked at again.
        before = proxy.claims_derived
        worker = dict(mine[1], status={**mine[1]["status"], "conditions": []})
        pod_cache.put(worker)
        wait_until(
            lambda: proxy.pod_index.objects[(NS, worker["metadata"]["name"])] is worker, 10, "the event"
        )
        assert proxy.claims_derived - before == 1
        assert proxy.listening() == sorted(wanted)

        # A connection from the node through the Service: its own job's coordinator and policy, nothing else.
        pods_seen, policies_seen = proxy.pod_index.visited, proxy.policy_index.visited
        with socket.create_connection((svc_ip, RDZV_PORT), timeout=10) as s:
            s.sendall(b"ping")
            assert s.recv(4) == b"ping"
        assert proxy.pod_index.visited - pods_seen == len(mine)  # the job's pods, walked by its name
        assert proxy.policy_index.visited - policies_seen == 1
    finally:
        proxy.stop()
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone keeps the port bound)
        listener.close()


def test_stopping_the_proxy_ends_the_connections_it_holds_open():
    n = random.randrange(1, 250)
    coord_ip, svc_ip = f"127.10.245.{n}", f"127.96.245.{n}"
    mine = job_pods("mine", coord_ip, f"127.10.244.{n}")
    listener = echo_server(own_ip(mine[0], coord_ip))
    proxy = ServiceProxy(Cache([job_service("mine", svc_ip)]), Cache(mine), Cache([]), Cache([])).start()
    try:
        wanted = [(coord_ip, RDZV_PORT), (svc_ip, RDZV_PORT)]
        wait_until(lambda: proxy.listening() == sorted(wanted), 20, "the proxy to listen for the job")
        with socket.create_connection((svc_ip, RDZV_PORT), timeout=10) as s:
            # an idle connection (the echo server waits for its 4 bytes), as a worker's to the rendezvous store
            wait_until(lambda: len(proxy._connections) == 1, 10, "the proxy to hold the connection")
            proxy.stop()
            # its handler ended while the loop ran: the client sees the connection closed, not a hang, and no
            # handler is left to close its sockets from the garbage collector after the loop closed
            assert s.recv(4) == b""
            assert not proxy._connections
    finally:
        proxy.stop()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()


def test_label_index_follows_updates_and_deletes():
    index = LabelIndex()
    a = {"metadata": {"name": "a", "namespace": "x", "uid": "1", "labels": {"job": "j", "role": "w"}}}
    index.put(("x", "a"), a)
    assert index.select("x", {"job": "j"}) == [a] and index.by_uid("1") is a
    moved = {"metadata": {"name": "a", "namespace": "x", "uid": "1", "labels": {"job": "k"}}}
    index.put(("x", "a"), moved)
    assert index.select("x", {"job": "j"}) == [] and index.select("x", {"job": "k"}) == [moved]
    assert index.select("y", {"job": "k"}) == [] and index.select("x", {}) == []
    index.put(("x", "a"), None)
    assert index.select("x", {"job": "k"}) == [] and index.by_uid("1") is None


def test_selector_index_files_each_selector_under_its_rarest_pair_and_keeps_empty_ones_for_all():
    index = SelectorIndex()
    for i in range(50):
        index.put(("x", f"p{i}"), {"i": i}, {"role": "coordinator", "job": f"j{i}"})
    index.put(("x", "all"), {"i": "all"}, {})
    found = index.candidates("x", {"role": "coordinator", "job": "j7"})
    # the first selector was filed under job (sorted first), every later one under its job too
    assert {o["i"] for o in found} == {7, "all"}
    assert index.candidates("y", {"role": "coordinator", "job": "j7"}) == []
    index.put(("x", "p7"), None)
    assert [o["i"] for o in index.candidates("x", {"job": "j7"})] == ["all"]
