"""The trainer's import graph: layers only point down and there are no cycles (read from the sources' ast), and
contract.py, which the operator and the local cluster import too, stays stdlib only.

Bottom to top (docs/INTERFACES.md): contract, the model registry and the leaves that import nothing of the package
-> events, preemption, progress, shard_io -> config, fence -> data, the models, engine, checkpoint_store -> the
checkpointer's parts (checkpoint_copy, checkpoint_save, checkpoint_load, checkpoint_staging) -> checkpoint, startup
-> the loop's parts (reporting, stopping) -> the entry points (train, launch, coordinator). Every import statement counts, also one
inside a function.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from support.layers import Package

PKG = Path(__file__).resolve().parents[2] / "trainer_image" / "ftjob_trainer"

# Module name (relative to ftjob_trainer) prefix -> layer; a longer prefix wins.
LAYERS = {
    "": 0,  # the package's __init__: imports nothing (the operator imports ftjob_trainer.contract)
    "contract": 0,
    "models": 0,  # the registry of presets (models/__init__.py), torch-free
    "memory_tier": 0,
    "shard_direct": 0,
    "checkpoint_layout": 0,
    "checkpoint_state": 0,
    "parallelize": 0,
    "compile_cache": 0,
    "warm_worker": 0,
    "warm_forkserver": 0,
    "torchrun_args": 0,  # the launcher's torch-free reading of torchrun's flags
    "events": 1,
    "warm_imported": 2,  # emits an event at import
    "preemption": 1,
    "progress": 1,
    "shard_io": 1,
    "config": 2,
    "fence": 2,  # the world epoch and the commit check (contract, events, progress below it)
    "data": 3,
    "models.llama": 3,
    "models.hf": 3,
    "engine": 3,
    "checkpoint_store": 3,
    "read_ahead": 3,
    "peer_restart": 3,  # the trainer's own parser (config), imported once the launcher's forkserver started
    "checkpoint_copy": 4,
    "checkpoint_save": 4,
    "checkpoint_load": 4,
    "checkpoint_staging": 4,  # Staging: the state to DCP under the guard, and the staging events
    "checkpoint": 5,
    "startup": 5,
    "reporting": 6,
    "stopping": 6,
    "train": 7,
    "launch": 7,
    "coordinator": 7,
}


TRAINER = Package(PKG, "ftjob_trainer", LAYERS)


def test_every_module_has_a_layer():
    for m in TRAINER.modules():
        TRAINER.layer(m)
    stale = TRAINER.stale_layers()
    assert not stale, f"LAYERS names modules that no longer exist: {stale}"


def test_imports_point_down():
    upward = TRAINER.upward()
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    cycles = TRAINER.cycles()
    assert not cycles, "\n".join(cycles)


def test_the_graph_is_read():
    """Guards the reader above: it must see the trainer's imports, or the checks pass vacuously."""
    graph = TRAINER.import_graph()
    assert {"checkpoint", "startup", "reporting", "stopping", "preemption", "contract"} <= graph["train"]
    assert {"checkpoint_save", "checkpoint_load", "checkpoint_state", "checkpoint_copy"} <= graph[
        "checkpoint"
    ]
    assert {"checkpoint", "reporting", "preemption"} <= graph["stopping"]
    assert graph["models.hf"] == {"config"} and graph["models.llama"] == {"models"}
    # the launcher's module-level imports stay torch-free: its forkserver must start before anything imports torch
    # (read_ahead, which does, is imported inside reading_ahead, after the forkserver started)
    assert graph["launch"] == {
        "warm_worker",
        "contract",
        "events",
        "peer_restart",
        "read_ahead",
        "torchrun_args",
    }
    assert graph["contract"] == set() and graph[""] == set()


def _imported_top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name} imports a sibling module"
            names.add((node.module or "").split(".")[0])
    return names


def test_the_contract_is_stdlib_only():
    """The operator's image has no torch and the local cluster imports the contract too: the standard library only.
    (tests/test_contract.py also imports it in a fresh interpreter and checks torch stayed out.)"""
    names = _imported_top_level_names(PKG / "contract.py")
    assert "json" in names, "the reader must see the contract's imports"
    outside = sorted(n for n in names if n != "__future__" and n not in sys.stdlib_module_names)
    assert not outside, f"contract.py imports {outside}: keep it stdlib only (it is shared with the operator)"
    assert _imported_top_level_names(PKG / "__init__.py") == set(), (
        "the package's __init__ must import nothing"
    )
