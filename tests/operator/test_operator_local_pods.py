"""The rendered pods on the local kubelet: containers with `args` and no `command` (the image's entrypoint, tini,
stays PID 1 on a real node) run their args; a container with neither is refused with a message that says what to set.

One local cluster (API server + node agent, no operator) for the module.
"""

from __future__ import annotations

import sys

import pytest
from ftjob_operator import api, render
from support.cluster import local_cluster
from support.wait import wait_until
from tj_builders import UID, job

pytestmark = [pytest.mark.slow]
NS = "default"


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    from ftjob_local.client import Kube

    with local_cluster(tmp_path_factory.mktemp("cluster"), nodes=1, spot_nodes=0) as cluster:
        yield Kube(str(cluster.kubeconfig))


def _create(kube, manifest: dict) -> None:
    kind = manifest["kind"].lower() + "s"
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": NS}}
    manifest["metadata"].pop("ownerReferences", None)  # no TrainingJob object exists in this test
    kube.request("POST", f"/api/v1/namespaces/{NS}/{kind}", body=manifest)


def _pod(kube, name: str) -> dict:
    return kube.get(f"/api/v1/namespaces/{NS}/pods/{name}") or {}


def test_rendered_coordinator_runs_from_args_alone_and_becomes_ready(kube):
    ref = render.JobRef(name="argsonly", namespace=NS, uid=UID)
    spec = api.parse_spec(job("argsonly")["spec"])
    pod = render.render_coordinator_pod(ref, spec, index=0, generation=0)
    container = pod["spec"]["containers"][0]
    assert "command" not in container and container["args"][:3] == [
        "python",
        "-m",
        "ftjob_trainer.coordinator",
    ]
    _create(kube, render.render_secret(ref, "t0ken"))
    _create(kube, pod)

    def ready():
        p = _pod(kube, "argsonly-coordinator-0")
        conds = {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions") or []}
        return p if conds.get("Ready") == "True" else None

    p = wait_until(ready, 60, "the coordinator started from args to pass its readiness probe")
    assert p["status"]["phase"] == "Running"
    kube.delete(f"/api/v1/namespaces/{NS}/pods/argsonly-coordinator-0", grace=0)


def test_args_alone_run_and_their_exit_code_counts(kube):
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "exits-three"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "x", "args": [sys.executable, "-c", "raise SystemExit(3)"]}
            ],
        },
    }
    _create(kube, body)

    def finished():
        p = _pod(kube, "exits-three")
        return p if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    p = wait_until(finished, 30, "the args-only pod to finish")
    assert p["status"]["phase"] == "Failed"
    assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_a_container_without_command_or_args_says_what_to_set(kube):
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "no-argv"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}]},
    }
    _create(kube, body)

    def waiting():
        p = _pod(kube, "no-argv")
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        state = (statuses[0].get("state") or {}).get("waiting") if statuses else None
        # ContainerCreating comes first, as from a real kubelet; the error follows once it tried to start it
        return state if state and state.get("reason") != "ContainerCreating" else None

    state = wait_until(waiting, 30, "the container to wait with a reason other than ContainerCreating")
    assert state["reason"] == "CreateContainerError"
    assert "neither command nor args" in state["message"] and "set args" in state["message"]
    kube.delete(f"/api/v1/namespaces/{NS}/pods/no-argv", grace=0)
