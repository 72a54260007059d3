"""The observed world: which pods are the job's, what an absent or lagging node view lets the planner conclude,
and how a pod is read."""

from __future__ import annotations

import json

import pytest
from ftjob_operator.planner import Create, Delete, Observed, observed, plan
from tj_builders import NOW, healthy_status, job, node, pod, pods_created, running_observed


@pytest.mark.parametrize("owner", ["someone-else", None], ids=["owned by another object", "no owner"])
def test_pods_not_owned_by_the_job_are_left_alone(owner):
    stranger = pod("worker", 7, generation=5, owner_uid=owner)
    obs = running_observed(job(status={"operator": {"knownPods": [], "nextPodIndex": 3}, "startTime": "x"}))
    with_stranger = plan(Observed(**dict(obs.__dict__, pods=obs.pods + [stranger])), NOW)
    assert with_stranger == plan(obs, NOW)  # not deleted as an old generation, not counted, not a name source


@pytest.mark.parametrize("nodes", [None, []], ids=["not listed", "empty index"])
def test_no_node_view_concludes_no_node_gone(nodes):
    obs = running_observed(job(status=healthy_status()), nodes=nodes)
    p = plan(obs, NOW)
    assert (p.status["preemptions"], p.status["failures"], p.status["operator"]["retiredPods"]) == (0, 0, [])
    assert [a for a in p.actions if isinstance(a, (Create, Delete))] == []


def test_the_node_index_keeps_what_the_planner_reads_and_no_heartbeat():
    from ftjob_operator.nodes import node_entry

    spec = {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": True, "podCIDR": "10.0.0.0/24"}
    status = {
        "conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "lastHeartbeatTime": "t1"},
            {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "t1"},
        ],
        "capacity": {"cpu": "2"},
    }
    entry = node_entry("n1", spec, status)
    nodes = observed.Nodes([entry])
    assert nodes.not_ready("n1") and nodes.cordoned("n1") and nodes.taint_keys("n1") == ["k"]
    # A heartbeat (new times, same statuses) leaves the entry as it was, so it wakes no job (handlers.py).
    beat = {
        "conditions": [dict(c, lastHeartbeatTime="t2") for c in status["conditions"]],
        "capacity": {"cpu": "2"},
    }
    assert node_entry("n1", spec, beat) == entry
    back = {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "t3"}]}
    assert node_entry("n1", spec, back) != entry
    assert not observed.Nodes([node_entry("n1", {}, back)]).not_ready("n1")
    assert not observed.Nodes([node_entry("n1", {}, back)]).cordoned("n1")


def test_a_node_missing_from_the_index_is_gone_only_after_its_deletion_was_seen():
    from ftjob_operator.nodes import node_view

    pods = [pod("coordinator", 0), pod("worker", 1), pod("worker", 2, node="node-new")]
    indexed = [node("node-a")]  # node-new's watch event has not arrived yet
    lagging = plan(
        running_observed(job(status=healthy_status()), pods=pods, nodes=node_view(indexed, pods, set())), NOW
    )
    assert (lagging.status["preemptions"], lagging.status["operator"]["retiredPods"]) == (0, [])
    assert [a for a in lagging.actions if isinstance(a, (Create, Delete))] == []
    assert node_view([], pods, set()) is None

    gone = plan(
        running_observed(
            job(status=healthy_status()), pods=pods, nodes=node_view(indexed, pods, {"node-new"})
        ),
        NOW,
    )
    assert (gone.status["preemptions"], gone.status["operator"]["retiredPods"]) == (1, ["tj-worker-2"])
    assert pods_created(gone) == ["tj-worker-3"]


# --- reading a pod ---------------------------------------------------------------------------------------------
def test_a_pod_succeeded_on_phase_or_on_exit_code_zero_unless_it_failed():
    assert observed.pod_succeeded(pod("worker", 1, exit_code=0))
    running_but_exited = pod("worker", 1, exit_code=0)
    running_but_exited["status"]["phase"] = "Running"  # the kubelet has not moved the phase yet
    assert observed.pod_succeeded(running_but_exited)
    failed_with_zero = pod("worker", 1, exit_code=0)
    failed_with_zero["status"]["phase"] = "Failed"
    assert not observed.pod_succeeded(failed_with_zero)
    assert not observed.pod_succeeded(pod("worker", 1))


def test_ready_means_running_and_not_marked_unready():
    assert observed.pod_ready(pod("worker", 1))
    assert not observed.pod_ready(pod("worker", 1, ready=False))
    assert not observed.pod_ready(pod("worker", 1, phase="Pending"))
    no_conditions = pod("worker", 1)
    no_conditions["status"]["conditions"] = []
    assert observed.pod_ready(no_conditions)  # Running with no Ready condition reported yet


@pytest.mark.parametrize(
    "text,expected",
    [
        (json.dumps({"reason": "preempted", "step": 7}), {"reason": "preempted", "step": 7}),
        (json.dumps(["not", "an", "object"]), {"message": '["not", "an", "object"]'}),
        ("Traceback ... boom", {"message": "Traceback ... boom"}),
        ("x" * 600 + "end", {"message": ("x" * 600 + "end")[-observed.MAX_MESSAGE :]}),
        ("", {}),
        (None, {}),
    ],
    ids=["json", "json but not an object", "text", "long text keeps its end", "empty", "none"],
)
def test_termination_message(text, expected):
    assert observed.termination_message(pod("worker", 1, exit_code=1, term_message=text)) == expected


@pytest.mark.parametrize(
    "the_pod,nodes,loss",
    [
        (pod("worker", 1), [node("node-a")], None),
        (pod("worker", 1, exit_code=0), [node("node-a")], None),
        (pod("worker", 1, deleting=True), [node("node-a")], "deleted"),
        (pod("worker", 1, exit_code=1), [node("node-a")], "failed"),
        (pod("worker", 1, node="node-b"), [node("node-a")], "node gone"),
        (pod("worker", 1, node="node-b"), None, None),
        (pod("worker", 1, node="node-b"), [], None),
        (pod("worker", 1, waiting="ImagePullBackOff"), [node("node-a")], "ImagePullBackOff"),
        (pod("worker", 1, waiting="ContainerCreating"), [node("node-a")], None),
    ],
    ids=[
        "running",
        "succeeded",
        "deleting",
        "failed",
        "node gone",
        "no node view",
        "empty node index",
        "fatal waiting reason",
        "still starting",
    ],
)
def test_loss_of(the_pod, nodes, loss):
    assert observed.loss_of(the_pod, observed.Nodes(nodes)) == loss


def test_labels_that_are_not_numbers_read_as_minus_one():
    odd = pod("worker", 1)
    odd["metadata"]["labels"].update({"ftjob.dev/restart-generation": "x", "ftjob.dev/pod-index": ""})
    assert (observed.pod_generation(odd), observed.pod_index(odd)) == (-1, -1)
    assert (
        observed.pod_generation(pod("worker", 4, generation=2)),
        observed.pod_index(pod("worker", 4)),
    ) == (2, 4)
