"""The real operator (`ftjob operator`, kopf, as a subprocess) against the real local cluster: recovery. A
preempted worker replaced at once, an operator crash in the middle of a preemption, and passes that read pods
from the watch-fed caches, which replace a pod deleted while the operator was down.

Workers run a stand-in trainer (handlers_e2e_testlib.FAKE_TRAINER) under the real torchrun, rendezvousing at the
real coordinator, so each test is about the operator and takes seconds. Every wait polls a condition with a
timeout and prints the job, its pods and the operator's log when it gives up.
"""

from __future__ import annotations

import urllib.request

import pytest
from ftjob_local.preempt import request_preemption
from ftjob_operator import render
from handlers_e2e_testlib import NS, PODS, Env, _condition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
]


def test_preempted_worker_is_replaced_at_once_and_counted_as_a_preemption(jobs):
    env, name = jobs, "preempt"
    # A save that takes 6 s (inside the 10 s grace period) keeps the old pod terminating long enough to see that
    # its replacement does not wait for it, even on a loaded machine.
    env.create_job(name, "serve", podTemplate={"env": [{"name": "FAKE_SAVE_SECONDS", "value": "6"}]})
    env.until(
        lambda: env.status(name).get("phase") == "Running" and env.status(name)["workers"]["ready"] == 1,
        60,
        "Running",
        name,
    )
    # Running (ready) only says the worker's container started. Until torchrun has started its workers (importing
    # torch, reaching the store, the rendezvous) it has no SIGTERM handler and dies of the signal at once, and the
    # kubelet then deletes the pod with it: no grace period to see. The fake trainer's first progress report
    # proves both torchrun and the trainer handle SIGTERM now, so the old pod stays for the 6 s save.
    env.until(
        lambda: (env.coordinator_progress(name) or {}).get("step"),
        60,
        "the fake trainer's first progress report",
        name,
    )
    (old,) = env.live_workers(name)
    node = old["spec"]["nodeName"]
    request_preemption(env.kube, node, notice=1.0, replace_after=0.5)

    def replacement_while_old_terminates():
        pods = {p["metadata"]["name"]: p for p in env.pods(name, "worker")}
        new = [n for n in pods if n != old["metadata"]["name"]]
        still = pods.get(old["metadata"]["name"])
        return new and still is not None and still["metadata"].get("deletionTimestamp") and new

    (new_name,) = env.until(
        replacement_while_old_terminates, 30, "a replacement while the old pod terminates", name
    )
    st = env.status(name)
    assert (st["preemptions"], st["failures"], st["restarts"]) == (1, 0, 0), st
    assert _condition(st, "Preempted")["status"] == "True"
    # kopf posts events in the background, shortly after the status write.
    env.until(
        lambda: {"TerminationNotice", "Preempted", "Replaced"} <= set(env.reasons(name)), 10, "events", name
    )
    new = env.kube.get(f"{PODS}/{new_name}")
    assert (
        new["metadata"]["labels"][render.LABEL_RESTART_GENERATION] == "0"
    )  # a replacement, not a job restart
    st = env.until(
        lambda: _condition(env.status(name), "Preempted").get("reason") == "Recovered" and env.status(name),
        60,
        "recovery (desired workers ready again)",
        name,
    )
    assert st["phase"] == "Running" and (st["preemptions"], st["failures"]) == (1, 0)
    assert env.kube.get(f"{PODS}/{new_name}")["spec"]["nodeName"] != node
    # The notice reached the coordinator as a checkpoint request, and the fake trainer answered it.
    assert "termination notice" in (st.get("lastCheckpoint") and env.coordinator_progress(name) or {}).get(
        "checkpointRequest", {}
    ).get("reason", ""), env.coordinator_progress(name)
    # Metrics: the counter comes from the status; the recovery was timed.
    assert env.operator.metric("ftjob_preemptions_total", namespace=NS, job=name) == 1
    assert env.operator.metric("ftjob_failures_total", namespace=NS, job=name) == 0
    assert (env.operator.metric("ftjob_time_to_recover_seconds_count") or 0) >= 1
    assert (env.operator.metric("ftjob_jobs", phase="Running") or 0) >= 1


def test_operator_crash_mid_preemption_makes_no_duplicates_and_keeps_counters(jobs):
    env, name = jobs, "restart"
    env.create_job(name, "serve", workers=2)
    env.until(
        lambda: env.status(name).get("phase") == "Running" and env.status(name)["workers"]["ready"] == 2,
        90,
        "Running with 2 workers",
        name,
    )
    before = env.live_workers(name)
    node = before[0]["spec"]["nodeName"]
    on_node = [p["metadata"]["name"] for p in before if p["spec"]["nodeName"] == node]
    request_preemption(env.kube, node, notice=0.0, replace_after=0.5)
    # Crash the operator the moment it has counted the preemption: the replacement may or may not be created yet.
    env.until(lambda: env.status(name).get("preemptions", 0) >= 1, 30, "the preemption to be counted", name)
    env.operator.crash()
    counted = env.status(name)["preemptions"]
    env.operator.start()
    st = env.until(
        lambda: (
            _condition(env.status(name), "Preempted").get("reason") == "Recovered"
            and env.status(name)["workers"]["ready"] == 2
            and env.status(name)
        ),
        90,
        "recovery after the operator restart",
        name,
    )
    assert st["preemptions"] == len(on_node) and counted <= len(on_node), (st, on_node)
    assert (st["failures"], st["restarts"]) == (0, 0), st
    live = env.live_workers(name)
    assert len(live) == 2, [p["metadata"]["name"] for p in live]
    assert not set(on_node) & {p["metadata"]["name"] for p in live}
    # No pod was created twice for one slot: nothing had to be scaled away.
    assert "ScaledDown" not in env.reasons(name), env.reasons(name)
    assert env.operator.metric("ftjob_preemptions_total", namespace=NS, job=name) == len(on_node)


def _api_requests(env: Env) -> dict[tuple[str, str], int]:
    """The local API server's request counts (GET /metrics): (VERB, resource) -> count."""
    url = env.kube.client.configuration.host + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    counts: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(","))
            key = (labels["verb"].strip('"'), labels["resource"].strip('"'))
            counts[key] = counts.get(key, 0) + int(line.rsplit(" ", 1)[1])
    return counts


def test_passes_read_pods_from_the_cache_and_a_pod_deleted_while_the_operator_is_down_is_replaced(jobs):
    env, name = jobs, "cached"
    env.create_job(name, "serve")
    env.until(
        lambda: env.status(name).get("phase") == "Running" and env.status(name)["workers"]["ready"] == 1,
        60,
        "Running",
        name,
    )
    # Every pass GETs its job fresh: wake the job a few times (an annotation change; one at a time, as the daemon
    # folds a burst of changes into one pass) and count the requests. None of the passes lists pods (nor Services,
    # nor Secrets): they read the watch-fed caches.
    before = _api_requests(env)
    for i in range(5):
        gets = _api_requests(env).get(("GET", "trainingjobs"), 0)
        env.patch_job(name, {"metadata": {"annotations": {"test.ftjob.dev/poke": str(i)}}})
        env.until(
            lambda gets=gets: _api_requests(env).get(("GET", "trainingjobs"), 0) > gets,
            30,
            f"a pass after poke {i}",
            name,
        )
    after = _api_requests(env)
    for resource in ("pods", "services", "secrets"):
        assert after.get(("LIST", resource), 0) == before.get(("LIST", resource), 0), (
            resource,
            before,
            after,
        )
        assert after.get(("GET", resource), 0) == before.get(("GET", resource), 0), (resource, before, after)

    # The operator stops; a worker is deleted while nothing watches; the new operator's cache lists it as gone.
    (old,) = env.live_workers(name)
    coordinators = {p["metadata"]["name"] for p in env.pods(name, render.ROLE_COORDINATOR)}
    env.operator.stop()
    try:
        env.kube.delete(f"{PODS}/{old['metadata']['name']}", grace=0)
        env.until(
            lambda: env.kube.get(f"{PODS}/{old['metadata']['name']}") is None, 30, "the worker gone", name
        )
    finally:
        env.operator.start()
    env.until(
        lambda: [p for p in env.live_workers(name) if p["metadata"]["name"] != old["metadata"]["name"]],
        60,
        "a replacement for the worker deleted while the operator was down",
        name,
    )
    # The first pass after the start saw the full cache: nothing else was created again.
    assert {p["metadata"]["name"] for p in env.pods(name, render.ROLE_COORDINATOR)} == coordinators
    assert len(env.live_workers(name)) == 1, [p["metadata"]["name"] for p in env.live_workers(name)]
