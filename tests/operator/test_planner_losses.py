"""The loss classification: the loss record (preemption or failure, with the evidence in words), one failure per
pass, and the coordinator's collateral not blamed. Trainer error reports: test_planner_losses_trainer_errors.py."""

from __future__ import annotations

import json

import pytest
from ftjob_operator import planner
from ftjob_operator.planner import plan, preemption
from ftjob_operator.planner.context import Context
from ftjob_operator.planner.losses import Loss, classify, new_losses
from ftjob_operator.planner.observed import MAX_MESSAGE, Nodes
from tj_builders import NOW, healthy_status, job, node, pod, reasons, running_observed, started, with_book


def test_peers_failing_in_the_same_pass_count_as_one_failure():
    store = started()
    for name in store.names("worker"):
        store.exit(name, 1)
    p = plan(store.observe(), NOW)
    assert p.status["failures"] == 1 and p.status["restarts"] == 1


@pytest.mark.parametrize("coordinator_index", [0, 3], ids=["first coordinator", "replaced coordinator"])
def test_a_coordinator_and_a_worker_failing_in_one_pass_blame_the_coordinator(coordinator_index):
    workers = [i for i in range(4) if i != coordinator_index][:2]
    pods = [pod("coordinator", coordinator_index, exit_code=1)]
    pods += [pod("worker", workers[0], exit_code=1), pod("worker", workers[1])]
    status = {
        "operator": {"knownPods": sorted(planner.pod_name(p) for p in pods), "nextPodIndex": 4},
        "startTime": "x",
    }
    p = plan(running_observed(job(status=status), pods=pods), NOW)
    assert (p.status["failures"], p.status["operator"]["restartGeneration"], p.status["restarts"]) == (
        1,
        0,
        0,
    )
    assert p.status["lastFailure"]["pod"] == f"tj-coordinator-{coordinator_index}"
    assert "LostWithCoordinator" in reasons(p)


# --- classify: the loss record, with the evidence in words ------------------------------------------------------
def test_a_failure_carries_exit_code_reason_and_the_trainers_message():
    failed = pod(
        "worker", 2, exit_code=3, term_reason="Error", term_message=json.dumps({"message": "loss is NaN"})
    )
    assert classify(failed, Nodes([node("node-a")]), set()) == Loss(
        "tj-worker-2", "worker", False, "Error", 3, "loss is NaN"
    )


def test_a_failure_without_a_trainer_message_keeps_the_end_of_the_containers_message():
    failed = pod("coordinator", 0, exit_code=1, term_reason="OOMKilled", term_message="x" * 600 + "killed")
    loss = classify(failed, Nodes([node("node-a")]), set())
    assert (loss.role, loss.preemption, loss.why, loss.exit_code) == ("coordinator", False, "OOMKilled", 1)
    assert len(loss.message) == MAX_MESSAGE and loss.message.endswith("killed")


def test_an_image_that_cannot_be_pulled_is_a_failure_named_by_its_waiting_reason():
    stuck = pod("worker", 1, waiting="ImagePullBackOff")
    assert classify(stuck, Nodes([node("node-a")]), set()) == Loss(
        "tj-worker-1", "worker", False, "ImagePullBackOff", None, "ImagePullBackOff for the image"
    )


def test_a_preemption_keeps_the_trainers_message_and_exit_code():
    msg = json.dumps({"reason": "preempted", "message": "saved step 7"})
    stopped = pod("worker", 1, exit_code=143, term_message=msg, node="node-gone")
    assert classify(stopped, Nodes([node("node-a")]), set()) == Loss(
        "tj-worker-1", "worker", True, "node node-gone is gone", 143, "saved step 7"
    )


def test_known_pods_that_vanished_are_preemptions_and_retired_ones_are_not_counted_again():
    status = with_book(healthy_status(), retiredPods=["tj-worker-2"])
    ctx = Context(running_observed(job(status=status), pods=[pod("coordinator", 0)]), NOW)
    assert new_losses(ctx) == [Loss("tj-worker-1", "worker", True, preemption.VANISHED)]
