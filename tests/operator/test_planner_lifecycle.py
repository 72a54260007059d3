"""The lifecycle: an edited template, success and TTL, suspend and resume, invalid specs, the image, the user's
checkpoint request, and new restart generations (their rendezvous ids)."""

from __future__ import annotations

import pytest
from ftjob_operator import conditions as cond
from ftjob_operator import planner
from ftjob_operator.planner import Create, Delete, Observed, RequestCheckpoint, lifecycle, plan
from ftjob_operator.planner.context import Context
from tj_builders import (
    NOW,
    UID,
    Store,
    at,
    condition,
    converge,
    healthy_status,
    job,
    pod,
    pods_created,
    reasons,
    running_observed,
    service,
    started,
    with_book,
)


@pytest.mark.parametrize(
    "edit,restarts",
    [
        (lambda sp: sp["workers"].update(max=3), True),  # torchrun --nnodes changes
        (lambda sp: sp.update(image="ftjob-trainer:v2"), True),
        (lambda sp: sp.update(trainer={"steps": 500}), True),
        (lambda sp: sp["workers"].update(replicas=1), False),  # scale is live
        (lambda sp: sp.update(ttlSecondsAfterFinished=60), False),
        (lambda sp: sp["failurePolicy"].update(maxFailures=9), False),
    ],
)
def test_an_edited_pod_template_restarts_the_pods_without_counting_a_failure(edit, restarts):
    store = started()
    edit(store.job["spec"])
    store.job["metadata"]["generation"] = 2
    p = plan(store.observe(), NOW)
    assert (p.status["operator"]["restartGeneration"] == 1) == restarts
    assert ("SpecChanged" in reasons(p)) == restarts
    if restarts:
        assert p.status["phase"] == "Restarting" and condition(p.status, "Restarting")["status"] == "True"
        assert condition(p.status, "Running")["status"] == "False" and p.status["workers"]["active"] == 0
        store.apply(p)
        converge(store, at(1))
        store.finish_terminating()
        converge(store, at(2))
        assert {planner.pod_generation(x) for x in store.pods.values()} == {1}
        assert (store.status["failures"], store.status["preemptions"], store.status["phase"]) == (
            0,
            0,
            "Running",
        )
        assert condition(store.status, "Restarting")["status"] == "False"


@pytest.mark.parametrize("policy,left", [("All", []), ("None", ["tj-worker-1"])])
def test_success_when_a_worker_exits_zero_and_cleanup_per_policy(policy, left):
    store = started(cleanPodPolicy=policy)
    store.exit("tj-worker-1", 0)  # tj-worker-2's torchrun may sit in its exit barrier for minutes
    p = plan(store.observe(), NOW)
    assert (
        p.status["phase"] == "Succeeded" and not p.of(Create) and not p.of(Delete)
    )  # deletes after the write
    assert condition(p.status, "Succeeded")["status"] == "True"
    assert condition(p.status, "Running")["status"] == "False"
    assert p.status["completionTime"] == "2026-01-01T12:00:00Z"
    store.apply(p)
    converge(store, at(1))
    store.finish_terminating()
    assert (
        sorted(store.pods) == left
    )  # still-running pods and the coordinator always go; ended ones per policy


def test_ttl_deletes_the_job_after_it_finished():
    store = started(ttlSecondsAfterFinished=30)
    for name in store.names("worker"):
        store.exit(name, 0)
    converge(store, NOW)
    early = plan(store.observe(), at(10))
    assert not [a for a in early.of(Delete) if a.kind == "TrainingJob"] and early.requeue_after == 20
    late = plan(store.observe(), at(30))
    assert Delete("TrainingJob", "tj", uid=UID) in late.actions  # never a recreated job of the same name


def test_suspend_checkpoints_waits_then_deletes_pods_and_resume_continues():
    store = started()
    store.job["spec"]["suspend"] = True
    p = plan(store.observe(), NOW)
    assert [a.reason for a in p.of(RequestCheckpoint)] == ["suspend"] and p.status["phase"] == "Suspending"
    store.apply(p)
    assert not plan(store.observe(), at(5)).of(RequestCheckpoint)  # asked once, waiting
    store.progress = {
        "step": 40,
        "lastCheckpoint": {"step": 40, "time": "2026-01-01T12:00:06Z", "path": "/ck/40"},
    }
    p2 = plan(store.observe(), at(7))
    assert p2.status["phase"] == "Suspended" and p2.status["operator"]["restartGeneration"] == 1
    assert "checkpoint at step 40" in condition(p2.status, "Suspended")["message"]
    store.apply(p2)
    converge(store, at(8))
    store.finish_terminating()
    converge(store, at(9))
    assert store.pods == {} and store.status["phase"] == "Suspended"
    assert (store.status["preemptions"], store.status["failures"]) == (0, 0)
    store.job["spec"]["suspend"] = False
    converge(store, at(20))
    assert store.status["phase"] == "Running" and len(store.names("worker")) == 2
    assert condition(store.status, "Suspended")["reason"] == cond.REASON_RESUMED
    assert store.status["lastCheckpoint"]["step"] == 40
    # Suspended from +7 (the pods were deleted) to +20: not elapsed time (status.progress.goodput).
    assert store.status["operator"]["suspendedSeconds"] == 13


def test_suspend_gives_up_waiting_after_the_timeout():
    store = started(checkpoint={"suspendTimeoutSeconds": 30})
    store.job["spec"]["suspend"] = True
    store.apply(plan(store.observe(), NOW))
    assert plan(store.observe(), at(29)).status["phase"] == "Suspending"
    p = plan(store.observe(), at(30))
    assert p.status["phase"] == "Suspended"
    assert "no checkpoint within suspendTimeoutSeconds" in condition(p.status, "Suspended")["message"]


def test_created_suspended_runs_nothing():
    p = plan(Observed(job=job(suspend=True), service=service(), secret_exists=True), NOW)
    assert p.status["phase"] == "Suspended" and not p.of(Create)


@pytest.mark.parametrize(
    "name,overrides,fix",
    [
        ("tj", {"workers": {"min": 3, "max": 2}}, "spec.workers.min (3) must be <= spec.workers.max (2)"),
        (
            "tj",
            {"workers": {"min": 1, "max": 2, "replicas": 5}},
            "replicas (5) must be within min..max (1..2)",
        ),
        (
            "tj",
            {"podTemplate": {"env": [{"name": "FTJOB_TOKEN", "value": "x"}]}},
            "FTJOB_TOKEN is set by the operator",
        ),
        (
            "tj",
            {"podTemplate": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}},
            "mounts volume 'data', which no volume defines",
        ),
        (
            "tj",
            {"podTemplate": {"volumes": [{"name": "ftjob-checkpoints", "emptyDir": {}}]}},
            "ftjob-checkpoints is taken",
        ),
        ("tj", {"trainer": {"flags": {"checkpoint-dir": "/x"}}}, "set it there"),
        ("tj", {"checkpoint": {"volume": {}}}, "exactly one of persistentVolumeClaim, hostPath, emptyDir"),
        ("tj", {"command": []}, "spec.command is empty"),
        ("9lives", {}, "must be a DNS-1035 label"),
        (
            "tj",
            {"workers": {"min": 0, "max": 1}},
            "spec.workers.min: Input should be greater than or equal to 1",
        ),
    ],
)
def test_invalid_spec_says_what_to_fix_and_creates_nothing(name, overrides, fix):
    obs = Observed(job=job(name, **overrides), service=service(), secret_exists=True, new_token="t")
    p = plan(obs, NOW)
    assert not p.of(Create)
    invalid = condition(p.status, "InvalidSpec")
    assert invalid["status"] == "True" and fix in invalid["message"], invalid["message"]
    assert p.status["phase"] == "Invalid" and "InvalidSpec" in reasons(p)
    again = plan(Observed(**dict(obs.__dict__, job=job(name, status=p.status, **overrides))), at(1))
    assert "InvalidSpec" not in reasons(again)  # one event, not one per pass


def test_fixing_an_invalid_spec_clears_the_condition_and_starts():
    bad = plan(Observed(job=job(workers={"min": 3, "max": 2}), service=service(), secret_exists=True), NOW)
    good = plan(Observed(job=job(status=bad.status), service=service(), secret_exists=True), at(1))
    assert condition(good.status, "InvalidSpec")["status"] == "False" and pods_created(good)


def test_checkpoint_request_annotation_is_asked_once_per_value():
    store = started()
    store.job["metadata"]["annotations"] = {"ftjob.dev/checkpoint-request": "1"}
    p = plan(store.observe(), NOW)
    assert [a.reason for a in p.of(RequestCheckpoint)] == ["annotation ftjob.dev/checkpoint-request=1"]
    store.apply(p)
    assert not plan(store.observe(), at(1)).of(RequestCheckpoint)
    store.job["metadata"]["annotations"]["ftjob.dev/checkpoint-request"] = "2"
    assert len(plan(store.observe(), at(2)).of(RequestCheckpoint)) == 1


def test_checkpoint_request_waits_for_a_ready_coordinator():
    obs = running_observed(
        job(annotations={"ftjob.dev/checkpoint-request": "now"}),
        pods=[pod("coordinator", 0, ready=False), pod("worker", 1)],
    )
    p = plan(obs, NOW)
    assert not p.of(RequestCheckpoint) and "handledCheckpointRequest" not in p.status["operator"]


class DefaultImageStore(Store):
    """The store, observed by an operator whose default trainer image is `default_image`."""

    default_image = ""

    def observe(self) -> Observed:
        return Observed(**dict(super().observe().__dict__, default_image=self.default_image))


def _images(store: Store) -> set[str]:
    return {p["spec"]["containers"][0]["image"] for p in store.pods.values()}


def _without_image(**overrides) -> dict:
    j = job(**overrides)
    del j["spec"]["image"]
    return j


def test_unset_image_uses_the_operators_default_and_keeps_it():
    store = DefaultImageStore(_without_image())
    store.default_image = "ghcr.io/ftjob/trainer:0.1.0"
    converge(store, NOW)
    assert len(store.names("worker")) == 2 and _images(store) == {"ghcr.io/ftjob/trainer:0.1.0"}
    assert store.status["image"] == "ghcr.io/ftjob/trainer:0.1.0"
    # An operator upgraded to a new default does not restart a running job, nor lose the image it runs.
    store.default_image = "ghcr.io/ftjob/trainer:0.2.0"
    p = converge(store, at(5))
    assert not p.of(Delete) and store.status["operator"]["restartGeneration"] == 0
    assert (
        _images(store) == {"ghcr.io/ftjob/trainer:0.1.0"}
        and store.status["image"] == "ghcr.io/ftjob/trainer:0.1.0"
    )
    # An image set in the spec wins (and restarts the pods, like any template edit).
    store.job["spec"]["image"] = "mine:1"
    store.job["metadata"]["generation"] = 2
    converge(store, at(10))
    store.finish_terminating()
    converge(store, at(11))
    assert store.status["operator"]["restartGeneration"] == 1 and _images(store) == {"mine:1"}
    assert store.status["image"] == "mine:1"


def test_a_new_job_without_image_takes_the_current_default():
    store = DefaultImageStore(_without_image())
    store.default_image = "ghcr.io/ftjob/trainer:0.2.0"
    converge(store, NOW)
    assert _images(store) == {"ghcr.io/ftjob/trainer:0.2.0"}


def test_spec_image_wins_over_the_default():
    store = DefaultImageStore(job(image="mine:2"))
    store.default_image = "ghcr.io/ftjob/trainer:0.1.0"
    converge(store, NOW)
    assert _images(store) == {"mine:2"} and store.status["image"] == "mine:2"


def test_unset_image_without_a_default_is_invalid_until_the_operator_has_one():
    obs = Observed(job=_without_image(), service=service(), secret_exists=True, new_token="t")
    p = plan(obs, NOW)
    assert not p.of(Create) and p.status["phase"] == "Invalid"
    message = condition(p.status, "InvalidSpec")["message"]
    assert "spec.image is not set" in message and "FTJOB_DEFAULT_TRAINER_IMAGE" in message
    assert "image" not in p.status
    # The same job, observed by an operator that has a default: valid, and pods are created with it.
    fixed = Observed(**dict(obs.__dict__, job=_without_image(status=p.status), default_image="trainer:1"))
    good = plan(fixed, at(1))
    assert condition(good.status, "InvalidSpec")["status"] == "False"
    created = [a.manifest for a in good.of(Create) if a.kind == "Pod"]
    assert created and {m["spec"]["containers"][0]["image"] for m in created} == {"trainer:1"}


def _rdzv_ids(store: Store) -> dict[str, str]:
    ids = {}
    for name in store.names("worker"):
        args = store.pods[name]["spec"]["containers"][0]["args"]
        ids[name] = next(a for a in args if a.startswith("--rdzv-id="))
    return ids


def test_replacements_keep_the_rendezvous_id_and_a_restart_generation_gets_a_new_one():
    store = started()
    before = _rdzv_ids(store)
    assert set(before.values()) == {f"--rdzv-id={UID}-g0"}
    # A preempted worker's replacement joins the same rendezvous as the survivor.
    store.preempt(store.names("worker")[0])
    converge(store, at(1))
    after = _rdzv_ids(store)
    assert len(after) == 2 and set(after) != set(before) and set(after.values()) == {f"--rdzv-id={UID}-g0"}
    # A failure restarts the job: the new generation's workers use a new rendezvous id.
    store.exit(store.names("worker")[0], 1, "Error")
    converge(store, at(2))
    store.finish_terminating()
    converge(store, at(60))
    assert store.status["operator"]["restartGeneration"] == 1
    assert set(_rdzv_ids(store).values()) == {f"--rdzv-id={UID}-g1"}


def test_a_new_generation_forgets_the_pods_of_the_old_one():
    status = with_book(healthy_status(), restartGeneration=4, pendingPods=["tj-worker-3"])
    ctx = Context(running_observed(job(status=status)), NOW)
    lifecycle.start_new_generation(ctx)
    assert (ctx.st.operator.restart_generation, ctx.st.operator.pending_pods, ctx.st.operator.known_pods) == (
        5,
        [],
        [],
    )
    assert ctx.prev.operator.restart_generation == 4  # the persisted status still accounts for the old pods
