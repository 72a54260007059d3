"""The local cluster's import graph: layers only point down and there are no cycles (read from the sources' ast).

Bottom to top (docs/INTERFACES.md): shim, procs, records, layout, peers, labelindex -> client -> objects, netpolicy -> the
node's parts (kubelet/, scheduler, netproxy, preempt) -> node/ (the node agent) -> cluster -> the demo's parts
(session, timeline, demo_render) -> cli, demo. The API server (apiserver/) is its own stack
on the bottom layer. Every import statement counts, also one inside a function.
"""

from __future__ import annotations

from pathlib import Path

from support.layers import Package

PKG = Path(__file__).resolve().parents[2] / "localcluster" / "ftjob_local"

# Module name (relative to ftjob_local) prefix -> layer; a longer prefix wins.
LAYERS = {
    "": 0,  # the package's __init__: imports nothing
    "shim": 0,
    "procs": 0,
    "records": 0,
    "layout": 0,
    "peers": 0,
    "labelindex": 0,
    "client": 1,
    "objects": 2,
    "netpolicy": 2,
    "kubelet": 3,
    "scheduler": 3,
    "placement": 3,
    "netproxy": 3,
    "preempt": 3,
    "node": 4,
    "cluster": 5,
    "session": 6,
    "timeline": 6,
    "demo_render": 6,
    "cli": 7,
    "demo": 7,
    "apiserver": 3,
}


LOCAL = Package(PKG, "ftjob_local", LAYERS)


def test_every_module_has_a_layer():
    for m in LOCAL.modules():
        LOCAL.layer(m)
    stale = LOCAL.stale_layers()
    assert not stale, f"LAYERS names modules that no longer exist: {stale}"


def test_imports_point_down():
    upward = LOCAL.upward()
    assert not upward, "\n".join(upward)


def test_the_api_server_uses_only_the_bottom_layer():
    outside = [
        f"ftjob_local.{m} imports ftjob_local.{t}"
        for m, targets in LOCAL.import_graph().items()
        if m.startswith("apiserver")
        for t in targets
        if not t.startswith("apiserver") and LOCAL.layer(t) > LAYERS["objects"]
    ]
    assert not outside, "\n".join(outside)


def test_no_import_cycles():
    cycles = LOCAL.cycles()
    assert not cycles, "\n".join(cycles)


def test_the_graph_is_read():
    """Guards the reader above: it must see the node agent's imports, or the checks pass vacuously."""
    graph = LOCAL.import_graph()
    assert {"kubelet", "preempt", "scheduler", "client", "objects"} <= graph["node.agent"]
    assert "netproxy" not in graph["node.agent"], "the service proxy is a process of its own"
    assert {"netpolicy", "peers"} <= graph["netproxy"] and graph["netpolicy"] == set()
    assert {"records", "procs"} <= graph["cluster"] and graph["procs"] == {"shim"}
    assert graph["objects"] == {"client"} and graph["client"] == set()
