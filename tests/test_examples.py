"""Every example runs as written: each manifest in examples/ opens with a recipe (its `#   ` comment lines, shell
commands run from the repository root) that applies crds/ before the example, and on a fresh local cluster the
recipe's kubectl lines, run as they are, get every object of the file accepted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from ftjob_local.session import find_kubectl
from support.cluster import local_cluster

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "examples").glob("*.yaml"))
APPLY_CRDS = "kubectl apply -f crds/"


def recipe(path: Path) -> list[str]:
    """The commands of a file's header: its leading comment lines indented as commands ('#   ')."""
    commands = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("#   "):
            commands.append(line[4:].strip())
    return commands


def test_there_are_examples_and_every_manifest_applies_the_crds_first():
    assert MANIFESTS, "examples/ holds no manifest: this test would pass vacuously"
    for path in MANIFESTS:
        commands = recipe(path)
        apply_it = f"kubectl apply -f examples/{path.name}"
        assert APPLY_CRDS in commands and apply_it in commands, f"{path.name}: recipe {commands}"
        assert commands.index(APPLY_CRDS) < commands.index(apply_it), f"{path.name}: crds/ must come first"


@pytest.mark.slow
@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_the_recipe_gets_the_example_accepted_on_a_fresh_cluster(tmp_path, path):
    kubectl = find_kubectl()
    with local_cluster(tmp_path / "state", nodes=1, spot_nodes=0) as cluster:
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "PATH": f"{Path(kubectl).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "HOME": str(tmp_path),
        }
        if any(d and d["kind"] == "TrainingJob" for d in yaml.safe_load_all(path.read_text())):
            # Without the recipe's first step the file is refused: the order in the header matters.
            early = subprocess.run(
                [kubectl, "apply", "-f", str(path)], env=env, capture_output=True, text=True, timeout=60
            )
            assert early.returncode != 0, f"{path.name} was accepted without crds/: {early.stdout}"
        steps = [c for c in recipe(path) if c.startswith(("kubectl apply", "kubectl wait"))]
        for command in steps:
            done = subprocess.run(
                ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, f"{path.name}: `{command}` failed:\n{done.stdout}{done.stderr}"
        for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
            kind, name = doc["kind"].lower(), doc["metadata"]["name"]
            got = subprocess.run(
                [kubectl, "get", kind, name, "-o", "name"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert got.returncode == 0, f"{path.name}: {kind}/{name} was not created: {got.stderr}"
