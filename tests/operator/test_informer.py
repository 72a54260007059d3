"""The operator's watch-fed caches of the jobs' children (informer.py) against the local API server in this
process: after a watch restart and after a `410 Gone` they hold what a list returns, a pod deleted while nothing
watched is dropped (and its job woken), and Services and Secrets are read by name."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from ftjob_local.apiserver import start_in_thread
from ftjob_local.apiserver.resources import POD_KEY
from ftjob_local.cluster import write_kubeconfig
from ftjob_operator import render
from ftjob_operator.handlers import observe
from ftjob_operator.informer import JobChildren, NotSynced, trim
from ftjob_operator.kube import Kube
from ftjob_operator.runtime import Runtime

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
NS = "default"
PODS = f"/api/v1/namespaces/{NS}/pods"


def _pod(name: str, job: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {render.LABEL_JOB_NAME: job}},
        "spec": {"containers": [{"name": "c", "image": "x", "env": [{"name": "BIG", "value": "y" * 500}]}]},
    }


@pytest.fixture
def server(tmp_path: Path):
    handle = start_in_thread(str(tmp_path / "state"))
    write_kubeconfig(tmp_path / "kubeconfig", handle.url)
    yield handle, str(tmp_path / "kubeconfig")
    handle.stop()


async def _until(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_the_cache_holds_what_a_list_returns_across_a_watch_restart_and_a_410(server):
    handle, kubeconfig = server
    woken: list[tuple[str, str]] = []

    async def main() -> None:
        kube = await Kube.connect(kubeconfig)
        children = JobChildren(kube, [NS], lambda ns, job: woken.append((ns, job)), secrets=True)
        informer = children.informers[("pods", NS)]

        async def listed(job: str) -> list[dict]:
            doc = await kube.request(
                "GET", PODS, "list", query=[("labelSelector", f"{render.LABEL_JOB_NAME}={job}")]
            )
            return [trim("pods", p) for p in doc["items"]]

        async def same_as_a_list() -> bool:
            for job in ("j1", "j2"):
                cached = sorted(children.pods(NS, job), key=lambda p: p["metadata"]["name"])
                if cached != sorted(await listed(job), key=lambda p: p["metadata"]["name"]):
                    return False
            return True

        async def until_same(what: str) -> None:
            deadline = asyncio.get_running_loop().time() + 20
            while not await same_as_a_list():
                assert asyncio.get_running_loop().time() < deadline, f"the cache differs from a list {what}"
                await asyncio.sleep(0.05)

        try:
            for i in range(3):
                await kube.create(NS, _pod(f"a{i}", "j1"))
            await kube.create(NS, _pod("b0", "j2"))
            children.start()
            await asyncio.wait_for(children.wait_synced(), 20)
            assert await same_as_a_list() and len(children.pods(NS, "j1")) == 3
            assert "containers" not in children.pods(NS, "j1")[0]["spec"]  # trimmed to what the planner reads

            # A watch restart (the server ends every stream, once the informer's is open): the watch resumes from
            # its last version.
            def pod_watches() -> int:
                return handle.call(lambda: len(handle.server.store.kind(POD_KEY).watchers))

            await _until(lambda: pod_watches() > 0, "the pod watch open")
            handle.call(handle.server.store.close_watches)
            await kube.create(NS, _pod("a3", "j1"))
            await kube.delete(NS, "Pod", "a0", grace_period_seconds=0)
            await until_same("after a watch restart")
            assert informer.listings == 1

            # A 410: the streams end, a pod goes while nothing watches, and the history it would resume from is
            # compacted away. The informer lists again and drops the pod that the new listing lacks.
            woken.clear()

            def delete_unwatched_then_compact() -> None:
                store = handle.server.store
                store.close_watches()
                objects = handle.server.objects
                objects.delete(objects.registry.types[POD_KEY], NS, "b0", {"gracePeriodSeconds": 0})
                store.compact()

            await _until(lambda: pod_watches() > 0, "the pod watch open again")
            handle.call(delete_unwatched_then_compact)
            await _until(lambda: informer.listings == 2, "a second listing after the 410")
            await until_same("after a 410 Gone")
            assert children.pods(NS, "j2") == [] and (NS, "j2") in woken

            # Services and Secrets: read by name, from the same kind of cache.
            await kube.create(NS, {"apiVersion": "v1", "kind": "Service", "metadata": {
                "name": "j1-coordinator", "labels": {render.LABEL_JOB_NAME: "j1"}},
                "spec": {"ports": [{"port": 29400}]}})  # fmt: skip
            await kube.create(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {
                "name": "j1-token", "labels": {render.LABEL_JOB_NAME: "j1"}}, "stringData": {"token": "t"}})  # fmt: skip
            await _until(
                lambda: children.get("secrets", NS, "j1-token") is not None, "the Secret in the cache"
            )
            await _until(lambda: children.get("services", NS, "j1-coordinator") is not None, "the Service")
            assert children.get("services", NS, "j1-coordinator")["spec"]["clusterIP"].startswith("127.96.")
            assert children.get("secrets", NS, "j1-token")["data"] == {"token": "dA=="}
        finally:
            await children.stop()
            await kube.close()

    asyncio.run(main())


def test_the_cache_starts_unsynced_and_without_namespaces_watches_the_cluster(server):
    _, kubeconfig = server

    async def main() -> None:
        kube = await Kube.connect(kubeconfig)
        children = JobChildren(kube, [], lambda ns, job: None, secrets=False)
        try:
            assert not children.synced() and not children.watches("secrets")
            assert {i.path for i in children.informers.values()} == {"/api/v1/pods", "/api/v1/services"}
            await kube.create(NS, _pod("p-" + uuid.uuid4().hex[:6], "j9"))
            # Before its first listing a cache refuses to answer (it would say "no pods", and a pass would create
            # them again): the pass stops at observing and kopf retries it.
            with pytest.raises(NotSynced):
                children.pods(NS, "j9")
            with pytest.raises(NotSynced):
                children.get("services", NS, "j9-coordinator")
            rt = Runtime(namespaces=[], kubeconfig=None, metrics_port=0, peering=None, kube=kube)
            rt.children = children
            job = {"metadata": {"name": "j9", "namespace": NS, "uid": "u9"}, "spec": {"workers": {}}}
            with pytest.raises(NotSynced):
                await observe(rt, job, [], logging.getLogger("test"))
            children.start()
            await asyncio.wait_for(children.wait_synced(), 20)
            assert children.synced() and len(children.pods(NS, "j9")) == 1
        finally:
            await children.stop()
            await kube.close()

    asyncio.run(main())


def test_a_child_just_created_is_cached_at_once_and_its_watch_echo_wakes_no_one(server):
    _, kubeconfig = server
    woken: list[tuple[str, str]] = []

    async def main() -> None:
        kube = await Kube.connect(kubeconfig)
        children = JobChildren(kube, [NS], lambda ns, job: woken.append((ns, job)), secrets=False)
        informer = children.informers[("pods", NS)]
        try:
            children.start()
            await asyncio.wait_for(children.wait_synced(), 20)
            # The watch is paused while the pod is created, so its ADDED event comes after `remember` (as it does
            # under load); a running watch could deliver it first, and waking the job for it would then be right.
            await children.stop()
            # What the handlers do after a create: the next pass sees the pod before the watch brings it, so it
            # does not create it again (a 409 and a pass wasted per child, as the cache lagged under load).
            created = await kube.create_object(NS, _pod("c0", "j3"))
            children.remember("Pod", created)
            assert [p["metadata"]["name"] for p in children.pods(NS, "j3")] == ["c0"]
            assert "containers" not in children.pods(NS, "j3")[0]["spec"] and woken == []

            # The watch resumes from the version it had; the replayed ADDED event carries the version already held:
            # nobody is woken for it.
            children.start()
            version = int(created["metadata"]["resourceVersion"])
            await _until(lambda: int(informer.resource_version or 0) >= version, "the pod's ADDED event")
            assert woken == [] and len(children.pods(NS, "j3")) == 1
            # A change made elsewhere (here: its deletion) does wake the job.
            await kube.delete(NS, "Pod", "c0", grace_period_seconds=0)
            await _until(lambda: children.pods(NS, "j3") == [], "the pod gone from the cache")
            assert woken and set(woken) == {(NS, "j3")}
        finally:
            await children.stop()
            await kube.close()

    asyncio.run(main())
