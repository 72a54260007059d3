"""NetworkPolicy ingress as the local cluster's service proxy enforces it (ftjob_local/netpolicy.py): one row per
rule of Kubernetes' semantics, first with the policy the operator gives every job, then each selector form; and
which container opened a connection, read from /proc (ftjob_local/peers.py), with real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from ftjob_local import netpolicy, peers
from ftjob_local.procs import MARKER_ENV
from ftjob_operator import network_policy, render
from ftjob_trainer.contract import CONTROL_PORT, RDZV_PORT

NS = "team-a"
NAME = network_policy.NAMESPACE_NAME_LABEL  # the API server sets it on every namespace
NAMESPACES = {NS: {NAME: NS, "team": "a"}, "ftjob-system": {NAME: "ftjob-system", "tier": "platform"}}


def pod(labels: dict | None = None, ns: str = NS, ip: str = "127.10.0.5", ports: dict | None = None) -> dict:
    container_ports = [{"name": n, "containerPort": p} for n, p in (ports or {}).items()]
    return {
        "metadata": {"name": "p", "namespace": ns, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "ports": container_ports}]},
        "status": {"podIP": ip},
    }


def job_pod(job: str, role: str = "worker", ns: str = NS) -> dict:
    return pod({render.LABEL_JOB_NAME: job, render.LABEL_ROLE: role}, ns=ns)


def policy(spec: dict, ns: str = NS, name: str = "pol") -> dict:
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


OPERATOR = network_policy.OperatorPods("ftjob-system", {"app": "ftjob-operator"})
JOB_A = network_policy.render_network_policy(render.JobRef("a", NS, "uid-a"), OPERATOR)
COORDINATOR_A = job_pod("a", role="coordinator")
APP = pod({"app": "db"})
ANY = {"podSelector": {}}

# case: (target, port, source (None: the node), policies, allowed)
CASES = {
    # the job's own policy (operator/ftjob_operator/network_policy.py)
    "own worker -> rendezvous": (COORDINATOR_A, RDZV_PORT, job_pod("a"), [JOB_A], True),
    "own worker -> control API": (COORDINATOR_A, CONTROL_PORT, job_pod("a"), [JOB_A], True),
    "other job's worker -> rendezvous": (COORDINATOR_A, RDZV_PORT, job_pod("b"), [JOB_A], False),
    "plain pod -> rendezvous": (COORDINATOR_A, RDZV_PORT, pod(), [JOB_A], False),
    "own job's label in another namespace": (
        COORDINATOR_A,
        RDZV_PORT,
        job_pod("a", ns="other"),
        [JOB_A],
        False,
    ),
    "operator pod -> control API": (
        COORDINATOR_A,
        CONTROL_PORT,
        pod({"app": "ftjob-operator"}, ns="ftjob-system"),
        [JOB_A],
        True,
    ),
    "operator pod -> rendezvous": (
        COORDINATOR_A,
        RDZV_PORT,
        pod({"app": "ftjob-operator"}, ns="ftjob-system"),
        [JOB_A],
        False,
    ),
    "operator's labels in the job's namespace": (
        COORDINATOR_A,
        CONTROL_PORT,
        pod({"app": "ftjob-operator"}),
        [JOB_A],
        False,
    ),
    "own worker -> a port no rule names": (COORDINATOR_A, 8080, job_pod("a"), [JOB_A], False),
    "the node -> rendezvous": (COORDINATOR_A, RDZV_PORT, None, [JOB_A], True),
    "a pod the job's policy does not select (its worker)": (job_pod("a"), 9000, job_pod("b"), [JOB_A], True),
    # isolation: which policies select the target
    "no policy": (APP, 5432, pod(), [], True),
    "a policy of another namespace": (APP, 5432, pod(), [policy({"podSelector": {}}, ns="other")], True),
    "a policy selecting other pods": (
        APP,
        5432,
        pod(),
        [policy({"podSelector": {"matchLabels": {"app": "x"}}})],
        True,
    ),
    "deny all: empty podSelector, no rules": (APP, 5432, pod(), [policy({"podSelector": {}})], False),
    "allow all: one empty rule": (APP, 5432, pod(), [policy({"podSelector": {}, "ingress": [{}]})], True),
    "egress-only policyTypes does not isolate ingress": (
        APP,
        5432,
        pod(),
        [policy({"podSelector": {}, "policyTypes": ["Egress"]})],
        True,
    ),
    "egress rules without policyTypes still isolate ingress": (
        APP,
        5432,
        pod(),
        [policy({"podSelector": {}, "egress": [{}]})],
        False,
    ),
    "policies add up: one denies all, another admits": (
        APP,
        5432,
        pod(),
        [policy({"podSelector": {}}, name="deny"), policy({"podSelector": {}, "ingress": [{"from": [ANY]}]})],
        True,
    ),
    # ports
    "named port resolved on the target": (
        pod({"app": "db"}, ports={"sql": 5432}),
        5432,
        pod(),
        [policy({"podSelector": {}, "ingress": [{"ports": [{"port": "sql"}]}]})],
        True,
    ),
    "named port the target lacks": (
        APP,
        5432,
        pod(),
        [policy({"podSelector": {}, "ingress": [{"ports": [{"port": "sql"}]}]})],
        False,
    ),
    "port range with endPort": (
        APP,
        29401,
        pod(),
        [policy({"podSelector": {}, "ingress": [{"ports": [{"port": 29000, "endPort": 29500}]}]})],
        True,
    ),
    "below the range": (
        APP,
        28999,
        pod(),
        [policy({"podSelector": {}, "ingress": [{"ports": [{"port": 29000, "endPort": 29500}]}]})],
        False,
    ),
    "a UDP rule does not admit TCP": (
        APP,
        5432,
        pod(),
        [policy({"podSelector": {}, "ingress": [{"ports": [{"port": 5432, "protocol": "UDP"}]}]})],
        False,
    ),
    # peers
    "namespaceSelector alone: any pod of a selected namespace": (
        APP,
        5432,
        pod(ns="ftjob-system"),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"tier": "platform"}}}]}],
                }
            )
        ],
        True,
    ),
    "namespaceSelector: a namespace it does not select": (
        APP,
        5432,
        pod(),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"tier": "platform"}}}]}],
                }
            )
        ],
        False,
    ),
    "namespaceSelector by the name label of a namespace without an object": (
        APP,
        5432,
        pod(ns="ghost"),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [
                        {
                            "from": [
                                {
                                    "namespaceSelector": {
                                        "matchLabels": {"kubernetes.io/metadata.name": "ghost"}
                                    }
                                }
                            ]
                        }
                    ],
                }
            )
        ],
        True,
    ),
    "namespaceSelector and podSelector: right namespace, wrong pod": (
        APP,
        5432,
        pod({"app": "web"}, ns="ftjob-system"),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [
                        {
                            "from": [
                                {
                                    "namespaceSelector": {"matchLabels": {"tier": "platform"}},
                                    "podSelector": {"matchLabels": {"app": "api"}},
                                }
                            ]
                        }
                    ],
                }
            )
        ],
        False,
    ),
    "matchExpressions In": (
        APP,
        5432,
        pod({"app": "web"}),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [
                        {
                            "from": [
                                {
                                    "podSelector": {
                                        "matchExpressions": [
                                            {"key": "app", "operator": "In", "values": ["web", "api"]}
                                        ]
                                    }
                                }
                            ]
                        }
                    ],
                }
            )
        ],
        True,
    ),
    "matchExpressions NotIn": (
        APP,
        5432,
        pod({"app": "web"}),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [
                        {
                            "from": [
                                {
                                    "podSelector": {
                                        "matchExpressions": [
                                            {"key": "app", "operator": "NotIn", "values": ["web"]}
                                        ]
                                    }
                                }
                            ]
                        }
                    ],
                }
            )
        ],
        False,
    ),
    "matchExpressions Exists": (
        APP,
        5432,
        pod({"app": "web"}),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [
                        {
                            "from": [
                                {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}
                            ]
                        }
                    ],
                }
            )
        ],
        True,
    ),
    "matchExpressions DoesNotExist": (
        APP,
        5432,
        pod({"app": "web"}),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [
                        {
                            "from": [
                                {
                                    "podSelector": {
                                        "matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]
                                    }
                                }
                            ]
                        }
                    ],
                }
            )
        ],
        False,
    ),
    "ipBlock holds the source pod's IP": (
        APP,
        5432,
        pod(ip="127.10.0.5"),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [
                        {"from": [{"ipBlock": {"cidr": "127.10.0.0/16", "except": ["127.10.0.9/32"]}}]}
                    ],
                }
            )
        ],
        True,
    ),
    "ipBlock except": (
        APP,
        5432,
        pod(ip="127.10.0.9"),
        [
            policy(
                {
                    "podSelector": {},
                    "ingress": [
                        {"from": [{"ipBlock": {"cidr": "127.10.0.0/16", "except": ["127.10.0.9/32"]}}]}
                    ],
                }
            )
        ],
        False,
    ),
    "a process of a pod the API server no longer has": (
        APP,
        5432,
        {"metadata": {"name": "gone", "namespace": "", "labels": {}}},
        [policy({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]})],
        False,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_ingress_verdict(case):
    target, port, source, policies, allowed = CASES[case]
    verdict = netpolicy.ingress_verdict(target, port, source, policies, NAMESPACES)
    assert verdict.allowed is allowed, verdict


def test_a_refusal_names_the_policies_that_isolate_the_pod():
    verdict = netpolicy.ingress_verdict(COORDINATOR_A, RDZV_PORT, job_pod("b"), [JOB_A], NAMESPACES)
    assert verdict.policies == (f"{NS}/a-coordinator",)
    assert verdict.reason == f"no ingress rule of {NS}/a-coordinator admits it"


TCP_TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0 100 0 0 10 0
   1: 0100007F:D431 0500607F:72D8 01 00000000:00000000 00:00000000 00000000  1000        0 222 1 0 20 4 30 10 -1
   2: 0500607F:72D8 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 333 1 0 20 4 30 10 -1
   3: 0100007F:D432 0500607F:72D8 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0
"""


@pytest.mark.skipif(sys.byteorder != "little", reason="the sample table is a little-endian machine's")
def test_socket_inode_finds_the_client_end_of_a_connection():
    client, service = ("127.0.0.1", 0xD431), ("127.96.0.5", 29400)
    assert peers.socket_inode(TCP_TABLE, client, service) == 222
    assert peers.socket_inode(TCP_TABLE, service, client) == 333  # the accepting side's own socket
    assert peers.socket_inode(TCP_TABLE, ("127.0.0.1", 0xD432), service) is None  # TIME_WAIT: no owner


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
@pytest.mark.parametrize("marker", ["uid-1/trainer/0a1b2c3d", None])
def test_container_marker_of_the_connecting_process(marker):
    """A real client process, with or without the kubelet's container marker in its environment."""
    with socket.socket() as listener:
        listener.bind(("127.96.255.254", 0))
        listener.listen()
        host, port = listener.getsockname()
        env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
        if marker:
            env[MARKER_ENV] = marker
        code = f"import socket; s = socket.create_connection(({host!r}, {port})); s.recv(1)"
        client = subprocess.Popen([sys.executable, "-c", code], env=env)
        try:
            conn, peer = listener.accept()
            with conn:
                assert peers.container_marker(peer, conn.getsockname()) == marker
        finally:
            client.wait(30)
    if marker:
        assert peers.pod_uid(marker) == "uid-1"


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_netlink_names_the_socket_of_exactly_one_connection():
    with socket.create_server(("127.96.255.253", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        conn, peer = listener.accept()
        with client, conn:
            own = int(os.readlink(f"/proc/self/fd/{client.fileno()}")[len("socket:[") : -1])
            assert peers.netlink_inode(peer, conn.getsockname()) == own
            assert peers.netlink_inode(conn.getsockname(), peer) != own  # the accepting end
            assert peers.netlink_inode((peer[0], peer[1] ^ 1), conn.getsockname()) is None


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_one_finder_follows_processes_that_come_and_go():
    """The finder remembers which processes carry a marker: a container started after the first look-up, a process
    of the node, and the first container again are each named right."""
    finder = peers.PeerFinder()
    with socket.create_server(("127.96.255.252", 0)) as listener:
        host, port = listener.getsockname()
        for marker in ["uid-1/c/1", "uid-2/c/2", None, "uid-1/c/3"]:
            env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
            if marker:
                env[MARKER_ENV] = marker
            code = f"import socket; s = socket.create_connection(({host!r}, {port})); s.recv(1)"
            client = subprocess.Popen([sys.executable, "-c", code], env=env)
            try:
                conn, peer = listener.accept()
                with conn:
                    assert finder.marker(peer, conn.getsockname()) == marker
            finally:
                client.wait(30)
