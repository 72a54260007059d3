"""The planner's and the API's shape: imports point down, and status.phase and the restart generation each have
one place that writes them (issue 11). A change that breaks these says where the new code belongs."""

from __future__ import annotations

import ast
from pathlib import Path

import ftjob_operator
import pytest

PACKAGE = Path(ftjob_operator.__file__).parent
# Bottom first: a module may import only modules listed before it.
PLANNER_LAYERS = [
    "observed",
    "context",
    "progress",
    "lifecycle",
    "preemption",
    "losses",
    "config_error",
    "failure",
    "children",
    "summary",
    "reconcile",
    "__init__",
]
API_LAYERS = [
    "base",
    "reserved",
    "workers",
    "checkpoint",
    "recovery",
    "trainer",
    "spread",
    "pods",
    "spec",
    "status",
    "job",
    "checks",
    "__init__",
]


def _tree(package: str, module: str) -> ast.Module:
    return ast.parse((PACKAGE / package / f"{module}.py").read_text())


def _siblings_and_parents(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Modules of the same package imported (`from .x import`, `from . import x`), and of the parent (`from ..`)."""
    siblings, parents = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            siblings |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 2:
            parents |= {node.module} if node.module else {a.name for a in node.names}
    return siblings, parents


def test_every_module_has_a_layer():
    assert sorted(p.stem for p in (PACKAGE / "planner").glob("*.py")) == sorted(PLANNER_LAYERS)
    assert sorted(p.stem for p in (PACKAGE / "api").glob("*.py")) == sorted(API_LAYERS)


@pytest.mark.parametrize("package,layers", [("planner", PLANNER_LAYERS), ("api", API_LAYERS)])
def test_imports_point_down(package, layers):
    for i, module in enumerate(layers):
        siblings, _ = _siblings_and_parents(_tree(package, module))
        above = siblings - set(layers[:i])
        assert not above, f"{package}/{module}.py imports {sorted(above)}, which sit above it"


def test_the_api_imports_nothing_else_of_the_operator():
    for module in API_LAYERS:
        _, parents = _siblings_and_parents(_tree("api", module))
        assert not parents, (
            f"api/{module}.py imports {sorted(parents)}: the API is the operator's bottom layer"
        )


def _writes(tree: ast.Module, attribute: str) -> list[str]:
    """The functions that assign or augment `<something>.st.<attribute>` (or `.st.operator.<attribute>`)."""
    found = []
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign):
                targets = [node.target]
            else:
                continue
            leaves = [leaf for t in targets for leaf in ast.walk(t) if isinstance(leaf, ast.Attribute)]
            if any(a.attr == attribute and _on_status(a.value) for a in leaves):
                found.append(func.name)
    return found


def _on_status(node: ast.expr) -> bool:
    """`<x>.st` or `<x>.st.operator`."""
    if isinstance(node, ast.Attribute) and node.attr == "operator":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "st"


@pytest.mark.parametrize(
    "attribute,where",
    [("phase", {"summary": ["conclude"]}), ("restart_generation", {"lifecycle": ["start_new_generation"]})],
)
def test_one_place_writes_it(attribute, where):
    writes = {m: _writes(_tree("planner", m), attribute) for m in PLANNER_LAYERS}
    assert {m: w for m, w in writes.items() if w} == where
