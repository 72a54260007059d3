"""A package's import graph read from its sources' ast, for the layer tests (the trainer's, the local cluster's):
which module imports which, each module's layer, the imports that point up and the cycles. Every import statement
counts, also one inside a function."""

from __future__ import annotations

import ast
from pathlib import Path


class Package:
    """`root` is the package's folder, `name` its import name; `layers` maps a module name (relative to the package)
    prefix to its layer, a longer prefix winning."""

    def __init__(self, root: Path, name: str, layers: dict[str, int]):
        self.root, self.name, self.layers = root, name, layers

    def modules(self) -> dict[str, Path]:
        out = {}
        for f in self.root.rglob("*.py"):
            parts = list(f.relative_to(self.root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
        return out

    def import_graph(self) -> dict[str, set[str]]:
        mods = self.modules()
        graph: dict[str, set[str]] = {m: set() for m in mods}
        for name, path in mods.items():
            here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            here = [p for p in here if p]
            for node in ast.walk(ast.parse(path.read_text())):
                graph[name] |= {t for t in self._targets(node, here, mods) if t in mods and t != name}
        return graph

    def _targets(self, node: ast.AST, here: list[str], mods: dict[str, Path]) -> list[str]:
        own = f"{self.name}."
        if isinstance(node, ast.Import):
            return [a.name[len(own) :] for a in node.names if a.name.startswith(own)]
        if not isinstance(node, ast.ImportFrom):
            return []
        if node.level:
            base = here[: len(here) - node.level + 1] + (node.module.split(".") if node.module else [])
        elif node.module == self.name or (node.module or "").startswith(own):
            base = node.module.split(".")[1:]
        else:
            return []
        prefix = ".".join(base)
        subs = [f"{prefix}.{a.name}" if prefix else a.name for a in node.names]
        return [sub if sub in mods else prefix for sub in subs]

    def layer(self, module: str) -> int:
        parts = module.split(".")
        for n in range(len(parts), 0, -1):
            key = ".".join(parts[:n])
            if key in self.layers:
                return self.layers[key]
        raise AssertionError(
            f"{self.name}.{module} has no layer: add it to LAYERS in its layer test and to docs/INTERFACES.md"
        )

    def stale_layers(self) -> list[str]:
        return sorted(set(self.layers) - set(self.modules()))

    def upward(self) -> list[str]:
        """Every import of a module from a higher layer, in words."""
        return [
            f"{self.name}.{m or '__init__'} (layer {self.layer(m)}) imports {self.name}.{t} (layer {self.layer(t)})"
            for m, targets in self.import_graph().items()
            for t in targets
            if self.layer(t) > self.layer(m)
        ]

    def cycles(self) -> list[str]:
        graph = self.import_graph()
        cycles: list[str] = []
        state: dict[str, str] = {}

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
        return cycles
