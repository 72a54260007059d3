"""The operator's client layer against real servers in this process: kube.Kube against the local API server
(start_in_thread), the coordinator client against the coordinator's own HTTP handler, and the metrics text.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import kopf
import pytest
import yaml
from ftjob_operator import kube as kube_mod
from ftjob_operator.coordinator_client import CoordinatorClient, CoordinatorError
from ftjob_operator.kube import ApiFailure, Kube
from ftjob_operator.metrics import Metrics
from ftjob_trainer.coordinator import State, make_handler
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
NS = "default"


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory):
    from ftjob_local.apiserver import start_in_thread
    from ftjob_local.client import Kube as PlainKube
    from ftjob_local.cluster import write_kubeconfig

    state = tmp_path_factory.mktemp("apiserver")
    handle = start_in_thread(str(state))
    try:
        path = state / "kubeconfig"
        write_kubeconfig(path, handle.url)
        crd = yaml.safe_load((REPO / "crds" / "trainingjobs.ftjob.dev.yaml").read_text())
        PlainKube(str(path)).request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd
        )
        yield str(path)
    finally:
        handle.stop()


def run(coro):
    return asyncio.run(coro)


async def _with_kube(kubeconfig: str, fn):
    kube = await Kube.connect(kubeconfig)
    try:
        return await fn(kube)
    finally:
        await kube.close()


def _secret(name: str, token: str = "t0k3n") -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"token": token}}


# --- kube.Kube -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_create_twice_is_done_and_the_secret_token_reads_back(kubeconfig):
    async def go(kube: Kube):
        first = await kube.create(NS, _secret("tok-a"))
        again = await kube.create(NS, _secret("tok-a", "other"))
        return (
            first,
            again,
            await kube.get_secret(NS, "tok-a", "token"),
            await kube.get_secret(NS, "nope", "token"),
        )

    first, again, secret, missing = run(_with_kube(kubeconfig, go))
    assert (first, again) == (True, False)
    assert secret.exists and secret.token == "t0k3n"  # the second create changed nothing
    assert not missing.exists


@pytest.mark.slow
def test_an_invalid_object_is_a_permanent_error_naming_the_object(kubeconfig):
    bad_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": {"containers": []}}

    async def go(kube: Kube):
        await kube.create(NS, bad_pod)

    with pytest.raises(kopf.PermanentError, match=r"create Pod default/bad: HTTP 422"):
        run(_with_kube(kubeconfig, go))


@pytest.mark.slow
def test_delete_with_grace_then_again_is_done_and_pods_list_by_label(kubeconfig):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1", "labels": {"ftjob.dev/job-name": "j1"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }

    async def go(kube: Kube):
        await kube.create(NS, pod)
        path = f"/api/v1/namespaces/{NS}/pods"
        listed = [p["metadata"]["name"] async for page, _ in kube.list_pages(path, "ftjob.dev/job-name=j1")
                  for p in page]  # fmt: skip
        other = [p async for page, _ in kube.list_pages(path, "ftjob.dev/job-name=j2") for p in page]
        deleted = await kube.delete(NS, "Pod", "p1", grace_period_seconds=0)
        again = await kube.delete(NS, "Pod", "p1")
        return listed, other, deleted, again

    listed, other, deleted, again = run(_with_kube(kubeconfig, go))
    assert (listed, other, deleted, again) == (["p1"], [], True, False)


@pytest.mark.slow
def test_delete_with_a_uid_precondition_spares_a_recreated_object(kubeconfig):
    async def go(kube: Kube):
        await kube.create(NS, _secret("tok-uid"))
        old_uid = (await kube.request("GET", f"/api/v1/namespaces/{NS}/secrets/tok-uid", "get"))["metadata"][
            "uid"
        ]
        assert await kube.delete(NS, "Secret", "tok-uid", uid=old_uid)
        await kube.create(NS, _secret("tok-uid", "new"))  # same name, another object
        spared = await kube.delete(NS, "Secret", "tok-uid", uid=old_uid)
        return spared, await kube.get_secret(NS, "tok-uid", "token")

    spared, secret = run(_with_kube(kubeconfig, go))
    assert spared is False
    assert secret.exists and secret.token == "new"


@pytest.mark.slow
def test_status_merge_patch_sets_and_removes_fields_and_leaves_the_spec(kubeconfig):
    job = {
        "apiVersion": "ftjob.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "st"},
        "spec": {"image": "img", "workers": {}},
    }

    async def go(kube: Kube):
        await kube.create(NS, job)
        await kube.patch_job_status(
            NS, "st", {"phase": "Running", "preemptions": 2, "backoffUntil": "2026-01-01T00:00:00Z"}
        )
        await kube.patch_job_status(NS, "st", {"backoffUntil": None})
        return await kube.get_job(NS, "st"), await kube.get_job(NS, "missing")

    got, missing = run(_with_kube(kubeconfig, go))
    assert missing is None
    assert got["status"]["phase"] == "Running" and got["status"]["preemptions"] == 2
    assert "backoffUntil" not in got["status"]
    assert got["spec"]["image"] == "img"


@pytest.mark.slow
def test_an_unreachable_server_is_a_temporary_error(tmp_path):
    from ftjob_local.cluster import free_port, write_kubeconfig

    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, f"http://127.0.0.1:{free_port()}")  # nothing listens there

    async def go(kube: Kube):
        await kube.get_job(NS, "x")

    with pytest.raises(kopf.TemporaryError, match="get TrainingJob default/x"):
        run(_with_kube(str(path), go))


def test_a_missing_kubeconfig_says_what_to_pass(tmp_path):
    with pytest.raises(kopf.PermanentError, match="--kubeconfig .* does not exist"):
        run(Kube.connect(str(tmp_path / "absent")))


@pytest.mark.parametrize(
    ("status", "temporary"),
    [(409, True), (429, True), (500, True), (503, True), (400, False), (403, False), (422, False)],
)
def test_retry_classification(status, temporary):
    err = kube_mod.classify(ApiFailure("patch x", status, "Reason", "msg"))
    assert isinstance(err, kopf.TemporaryError if temporary else kopf.PermanentError)
    assert f"patch x: HTTP {status} Reason: msg" in str(err)


# --- the coordinator client ------------------------------------------------------------------------------------
@pytest.fixture
def coordinator():
    """The coordinator's real control API (its HTTP half needs no torch), on a free port."""
    state = State()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state, "secret-token"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_checkpoint_request_and_progress_round_trip(coordinator):
    url, state = coordinator

    async def go():
        client = CoordinatorClient.create()
        try:
            rid = await client.request_checkpoint(
                url, "secret-token", "annotation ftjob.dev/checkpoint-request=1"
            )
            state.update(
                {"step": 7, "lastCheckpoint": {"step": 7, "path": "/ck/7", "time": "2026-01-01T00:00:00Z"}}
            )
            return rid, await client.progress(url, "secret-token")
        finally:
            await client.close()

    rid, progress = run(go())
    assert rid == 1
    assert progress["checkpointRequest"] == {"id": 1, "reason": "annotation ftjob.dev/checkpoint-request=1"}
    assert progress["step"] == 7 and progress["lastCheckpoint"]["step"] == 7


def test_a_wrong_token_is_an_error_that_shows_the_answer(coordinator):
    url, _ = coordinator

    async def go():
        client = CoordinatorClient.create()
        try:
            await client.progress(url, "wrong")
        finally:
            await client.close()

    with pytest.raises(CoordinatorError, match="HTTP 401.*bearer token"):
        run(go())


# --- metrics -----------------------------------------------------------------------------------------------------
def _samples(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counters_come_from_job_status_and_phases_are_counted():
    m = Metrics()
    m.record("ns", "a", {"phase": "Running", "preemptions": 3, "failures": 1, "restarts": 1, "step": 40})
    m.record("ns", "b", {"phase": "Running"})
    m.record("ns", "c", {})
    m.observe_recovery(4.2)
    s = _samples(m)
    assert s[("ftjob_preemptions_total", (("job", "a"), ("namespace", "ns")))] == 3
    assert s[("ftjob_failures_total", (("job", "a"), ("namespace", "ns")))] == 1
    assert s[("ftjob_jobs", (("phase", "Running"),))] == 2
    assert s[("ftjob_jobs", (("phase", "Pending"),))] == 1
    assert s[("ftjob_job_step", (("job", "a"), ("namespace", "ns")))] == 40
    assert s[("ftjob_time_to_recover_seconds_count", ())] == 1
    assert s[("ftjob_time_to_recover_seconds_bucket", (("le", "5.0"),))] == 1
    # A new operator process that reads the same status reports the same totals; a deleted job disappears.
    m2 = Metrics()
    m2.record("ns", "a", {"phase": "Running", "preemptions": 3})
    assert _samples(m2)[("ftjob_preemptions_total", (("job", "a"), ("namespace", "ns")))] == 3
    m2.forget("ns", "a")
    assert not [k for k in _samples(m2) if k[0] == "ftjob_preemptions_total"]


def test_progress_goodput_lost_time_and_checkpoint_age_come_from_job_status():
    from ftjob_operator.metrics import SERIES, checkpoint_age
    from ftjob_trainer.contract import parse_time

    m = Metrics()
    progress = {
        "percent": 42.0,
        "etaSeconds": 57,
        "goodput": 0.6667,
        "tokensPerSecond": 1234.5,
        "lost": {"preemptions": {"seconds": 11.5, "steps": 0}, "failures": {"seconds": 18.0, "steps": 5}},
    }
    saved = "2026-01-01T11:59:00Z"
    status = {
        "phase": "Running",
        "step": 42,
        "progress": progress,
        "lastCheckpoint": {"step": 40, "time": saved},
    }
    m.record("ns", "a", status)
    m.record("ns", "fresh", {"phase": "Pending"})  # no progress yet: no gauges, no lost time
    m.observe_recovery_to_first_step("preemption", 14.0)
    s = _samples(m)
    a = (("job", "a"), ("namespace", "ns"))
    assert s[("ftjob_job_progress_ratio", a)] == 0.42 and s[("ftjob_job_eta_seconds", a)] == 57
    assert s[("ftjob_job_goodput_ratio", a)] == 0.6667 and s[("ftjob_job_tokens_per_second", a)] == 1234.5
    assert s[("ftjob_job_lost_seconds_total", (("cause", "preemption"), *a))] == 11.5
    assert s[("ftjob_job_lost_steps_total", (("cause", "failure"), *a))] == 5
    assert s[("ftjob_job_checkpoint_age_seconds", a)] >= 0  # aged at scrape time
    assert checkpoint_age({"lastCheckpoint": {"time": saved}}, parse_time(saved).timestamp() + 90) == 90
    assert s[("ftjob_recovery_seconds_count", (("cause", "preemption"),))] == 1
    assert s[("ftjob_recovery_seconds_bucket", (("cause", "preemption"), ("le", "15.0")))] == 1
    new = (
        "ftjob_job_progress",
        "ftjob_job_eta",
        "ftjob_job_goodput",
        "ftjob_job_tokens",
        "ftjob_job_checkpoint",
    )
    assert not [k for k in s if ("job", "fresh") in k[1] and k[0].startswith((*new, "ftjob_job_lost"))]
    # Every series SERIES documents is served (a histogram as its _count).
    names = {name for name, _ in s} | {name.removesuffix("_count") for name, _ in s}
    assert set(SERIES) <= names, set(SERIES) - names


def test_a_stopped_daemon_leaves_nothing_of_its_job_in_the_runtime():
    from datetime import datetime, timezone

    from ftjob_operator.runtime import Runtime

    rt = Runtime(namespaces=[], kubeconfig=None, metrics_port=0, peering=None)
    for name in ("a", "b"):
        rt.metrics.record("ns", name, {"phase": "Running", "preemptions": 1})
        rt.waker("ns", name)
        rt.written[("ns", name)] = "7"
        rt.notices[("ns", name)] = datetime.now(timezone.utc)
        rt.record_created("ns", name, "Secret", f"{name}-token", "uid-" + name)
    rt.forget("ns", "a")
    assert (list(rt.wakers), list(rt.written), list(rt.notices), list(rt.created)) == ([("ns", "b")],) * 4
    assert not rt.was_created("ns", "a", "Secret", "a-token", "uid-a")
    assert rt.was_created("ns", "b", "Secret", "b-token", "uid-b")
    jobs = {labels for (metric, labels) in _samples(rt.metrics) if metric == "ftjob_preemptions_total"}
    assert jobs == {(("job", "b"), ("namespace", "ns"))}


# --- `ftjob operator` refusing to start ------------------------------------------------------------------------
@pytest.mark.slow
def test_operator_without_configuration_says_what_to_pass(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    env.update(HOME=str(tmp_path), KUBECONFIG="")
    cmd = [sys.executable, "-m", "ftjob_operator", "operator", "--metrics-port", "0"]
    none = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert none.returncode == 1, none.stderr
    assert "ftjob operator: no Kubernetes configuration: pass --kubeconfig" in none.stderr
    missing = subprocess.run(
        [*cmd, "--kubeconfig", str(tmp_path / "absent")], env=env, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 1, missing.stderr
    assert (
        missing.stderr.strip().splitlines()[-1]
        == f"ftjob operator: --kubeconfig {tmp_path / 'absent'} does not exist; pass an existing file"
    )
