"""The kubelet's sync against the in-process API server (issue 15): a pod's event syncs that pod alone, whatever
else the cluster holds; a change of the nodes syncs every pod; a new pod address skips the addresses other pods
carry, read from the events, not from a scan. Counted, not timed. The pods sit on a node this kubelet does not
serve, so no process is started."""

from __future__ import annotations

import json
import threading

import pytest
from ftjob_local.apiserver import start_in_thread
from ftjob_local.client import Informer, Kube
from ftjob_local.kubelet import Kubelet
from ftjob_local.objects import pod_path

NS = "default"
OTHERS = 200


@pytest.fixture
def world(tmp_path):
    server = start_in_thread(str(tmp_path / "state"))
    config = tmp_path / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "l", "cluster": {"server": server.url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "l", "context": {"cluster": "l", "user": "u"}}],
                "current-context": "l",
            }
        )
    )
    kube = Kube(str(config))
    for name in ("n0", "elsewhere"):
        kube.request("POST", "/api/v1/nodes", body={"metadata": {"name": name}})
    for i in range(OTHERS):
        body = {
            "metadata": {"name": f"p{i}", "namespace": NS},
            "spec": {"nodeName": "elsewhere", "containers": [{"name": "c", "image": "i"}]},
        }
        kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
    # the kubelet's next address is 127.10.3.232 (1000); a pod of another node already carries it
    kube.merge_patch(pod_path(NS, "p7", "status"), {"status": {"podIP": "127.10.3.232"}})
    node_dir = tmp_path / "node" / "node-agent"
    node_dir.mkdir(parents=True)
    (node_dir / "ipam.json").write_text(json.dumps({"next": 1000}))
    pods, nodes = Informer(kube, "/api/v1/pods", "pods"), Informer(kube, "/api/v1/nodes", "nodes")
    kubelet = Kubelet(kube, pods, nodes, tmp_path / "node", {"n0"})  # not started: the test calls sync()
    for inf in (pods, nodes):
        inf.start()
        assert inf.synced.wait(30)
    try:
        yield kube, kubelet, pods
    finally:
        for inf in (pods, nodes):
            inf.stop()
        server.stop()


def seen(informer: Informer, name: str, predicate) -> threading.Event:
    """Set once informer's listeners (the kubelet's, which come first) were told of object `name` matching."""
    done = threading.Event()
    informer.listeners.append(
        lambda _kind, obj: predicate(obj) and obj["metadata"]["name"] == name and done.set()
    )
    return done


def test_one_pod_event_syncs_one_pod_and_a_node_change_syncs_all(world):
    kube, kubelet, pods = world
    kubelet.sync()
    assert kubelet.pods_synced == OTHERS  # the first sync looks at every pod
    kubelet.sync()
    assert kubelet.pods_synced == OTHERS  # nothing happened: nothing to look at

    labelled = seen(pods, "p3", lambda o: (o["metadata"].get("labels") or {}).get("x") == "1")
    kube.merge_patch(pod_path(NS, "p3"), {"metadata": {"labels": {"x": "1"}}})
    assert labelled.wait(20)
    kubelet.sync()
    assert kubelet.pods_synced == OTHERS + 1

    arrived = seen(kubelet.nodes, "n1", lambda _o: True)
    kube.request("POST", "/api/v1/nodes", body={"metadata": {"name": "n1"}})
    assert arrived.wait(20)
    kubelet.sync()
    assert kubelet.pods_synced == 2 * OTHERS + 1


def test_a_new_address_skips_one_another_pod_carries(world):
    _, kubelet, pods = world
    assert pods.get(NS, "p7")["status"]["podIP"] == "127.10.3.232"
    assert kubelet.allocate_ip({"metadata": {"uid": "new"}, "spec": {}, "status": {}}) == "127.10.3.233"
