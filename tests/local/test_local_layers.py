"""The local cluster's import graph: layers only point down and there are no cycles (read from the sources' ast).

Bottom to top (docs/INTERFACES.md): shim, procs, records, layout, peers, labelindex -> client -> objects, netpolicy -> the
node's parts (kubelet/, scheduler, netproxy, preempt) -> node/ (the node agent) -> cluster -> the demo's parts
(session, timeline, demo_render) -> cli, demo. The API server (apiserver/) is its own stack
on the bottom layer. Every import statement counts, also one inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "localcluster" / "ftjob_local"

# Module name (relative to ftjob_local) prefix -> layer; a longer prefix wins.
LAYERS = {
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


def modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        here = [p for p in here if p]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1] + (
                        node.module.split(".") if node.module else []
                    )
                elif (node.module or "").startswith("ftjob_local"):
                    base = (node.module or "").split(".")[1:]
                else:
                    continue
                prefix = ".".join(base)
                for alias in node.names:
                    sub = f"{prefix}.{alias.name}" if prefix else alias.name
                    targets.append(sub if sub in mods else prefix)
            elif isinstance(node, ast.Import):
                targets = [
                    a.name[len("ftjob_local.") :] for a in node.names if a.name.startswith("ftjob_local.")
                ]
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def layer(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(
        f"ftjob_local.{module} has no layer: add it to LAYERS here and to docs/INTERFACES.md"
    )


def test_imports_point_down():
    upward = [
        f"ftjob_local.{m} (layer {layer(m)}) imports ftjob_local.{t} (layer {layer(t)})"
        for m, targets in import_graph().items()
        if m
        for t in targets
        if t and layer(t) > layer(m)
    ]
    assert not upward, "\n".join(upward)


def test_the_api_server_uses_only_the_bottom_layer():
    outside = [
        f"ftjob_local.{m} imports ftjob_local.{t}"
        for m, targets in import_graph().items()
        if m.startswith("apiserver")
        for t in targets
        if not t.startswith("apiserver") and layer(t) > LAYERS["objects"]
    ]
    assert not outside, "\n".join(outside)


def test_no_import_cycles():
    graph = import_graph()
    cycles, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycles.append(" -> ".join(path[path.index(t) :] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_the_graph_is_read():
    """Guards the reader above: it must see the node agent's imports, or the checks pass vacuously."""
    graph = import_graph()
    assert {"kubelet", "preempt", "scheduler", "client", "objects"} <= graph["node.agent"]
    assert "netproxy" not in graph["node.agent"], "the service proxy is a process of its own"
    assert {"netpolicy", "peers"} <= graph["netproxy"] and graph["netpolicy"] == set()
    assert {"records", "procs"} <= graph["cluster"] and graph["procs"] == {"shim"}
    assert graph["objects"] == {"client"} and graph["client"] == set()
