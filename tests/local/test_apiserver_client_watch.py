"""The embedded API server's watches against the official `kubernetes` Python client: from a resource version,
with selectors and bookmarks, without one, timeouts, many watchers at once; status errors for bad requests; and
persistence across a restart (a watch from before it gets 410 Gone)."""

from __future__ import annotations

import threading
import time

import pytest
from apiserver_client_testlib import NS, WIDGET_CRD, api_client
from ftjob_local.apiserver import start_in_thread
from ftjob_local.apiserver import watch as watch_mod
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from support.wait import wait_until


def test_watch_from_resource_version_selectors_and_bookmarks(api, monkeypatch):
    monkeypatch.setattr(watch_mod, "BOOKMARK_EVERY_S", 0.2)
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "before", "labels": {"w": "1"}}})
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def run():
        for ev in w.stream(
            core.list_namespaced_config_map,
            NS,
            label_selector="w=1",
            resource_version=rv,
            timeout_seconds=10,
            allow_watch_bookmarks=True,
        ):
            if ev["type"] == "BOOKMARK":
                seen.append(("BOOKMARK", ""))
                continue
            seen.append((ev["type"], ev["object"].metadata.name))
            if seen.count(("DELETED", "m")) == 2:  # the second: the real deletion
                w.stop()

    t = threading.Thread(target=run)
    t.start()
    try:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "m", "labels": {"w": "1"}}})
        core.create_namespaced_config_map(NS, {"metadata": {"name": "other"}})
        core.patch_namespaced_config_map("m", NS, {"data": {"k": "v"}})
        core.patch_namespaced_config_map("m", NS, {"metadata": {"labels": {"w": "2"}}})  # leaves the selector
        core.patch_namespaced_config_map("m", NS, {"metadata": {"labels": {"w": "1"}}})  # comes back
        wait_until(lambda: ("BOOKMARK", "") in seen, 10, "a bookmark", interval=0.02)
        core.delete_namespaced_config_map("m", NS)
    finally:
        t.join(timeout=15)
    events = [e for e in seen if e[0] != "BOOKMARK"]
    assert events == [("ADDED", "m"), ("MODIFIED", "m"), ("DELETED", "m"), ("ADDED", "m"), ("DELETED", "m")]


def test_watch_without_resource_version_lists_existing_first(api):
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "x1"}})
    w = watch.Watch()
    for ev in w.stream(core.list_namespaced_config_map, NS, timeout_seconds=5):
        assert (ev["type"], ev["object"].metadata.name) == ("ADDED", "x1")
        w.stop()


def test_state_survives_restart_and_old_watch_gets_410(tmp_path):
    state = str(tmp_path / "state")
    first = start_in_thread(state)
    try:
        with api_client(first.url) as c:
            core = client.CoreV1Api(c)
            client.ApiextensionsV1Api(c).create_custom_resource_definition(WIDGET_CRD)
            client.CustomObjectsApi(c).create_namespaced_custom_object(
                "test.ftjob.dev",
                "v1",
                NS,
                "widgets",
                {
                    "apiVersion": "test.ftjob.dev/v1",
                    "kind": "Widget",
                    "metadata": {"name": "keep"},
                    "spec": {"image": "i"},
                },
            )
            cm = core.create_namespaced_config_map(NS, {"metadata": {"name": "keep"}, "data": {"a": "b"}})
            old_rv = cm.metadata.resource_version
            core.patch_namespaced_config_map("keep", NS, {"data": {"a": "c"}})
    finally:
        first.stop()
    second = start_in_thread(state)
    with pytest.raises(RuntimeError, match="already using the state dir"):
        start_in_thread(state)  # one server per state dir
    try:
        with api_client(second.url) as c:
            core = client.CoreV1Api(c)
            kept = core.read_namespaced_config_map("keep", NS)
            assert kept.data == {"a": "c"} and int(kept.metadata.resource_version) > int(old_rv)
            w = client.CustomObjectsApi(c).get_namespaced_custom_object(
                "test.ftjob.dev", "v1", NS, "widgets", "keep"
            )
            assert w["spec"]["replicas"] == 1
            fresh = core.create_namespaced_config_map(NS, {"metadata": {"name": "new"}})
            assert int(fresh.metadata.resource_version) > int(kept.metadata.resource_version)
            with pytest.raises(
                ApiException
            ) as e:  # history before the restart is gone: the client must relist
                for _ in watch.Watch().stream(
                    core.list_namespaced_config_map, NS, resource_version=old_rv, timeout_seconds=5
                ):
                    pass
            assert e.value.status == 410
    finally:
        second.stop()


def test_watch_ends_after_timeout_seconds_and_bad_requests_get_status_errors(server, api):
    import json
    import urllib.error
    import urllib.request

    core = client.CoreV1Api(api)
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    started = time.monotonic()
    events = list(
        watch.Watch().stream(
            core.list_namespaced_config_map, NS, resource_version=rv, timeout_seconds=1, _request_timeout=10
        )
    )
    assert events == [] and 0.9 <= time.monotonic() - started < 5

    def status(method: str, path: str, body: bytes | None = None) -> dict:
        req = urllib.request.Request(
            server.url + path, data=body, method=method, headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        return json.loads(e.value.read())

    s = status("PUT", "/api/v1/namespaces/default/configmaps", b"{}")
    assert (s["code"], s["reason"]) == (405, "MethodNotAllowed")
    s = status("POST", "/api/v1/namespaces/default/configmaps", b"{not json")
    assert (s["code"], s["reason"]) == (400, "BadRequest") and "not valid JSON" in s["message"]
    s = status("GET", "/apis/nothing.example/v1/things")
    assert (s["code"], s["reason"]) == (404, "NotFound")
    s = status("GET", "/api/v1/namespaces/default/configmaps?labelSelector=a%20b%20c")
    assert s["code"] == 400 and "unable to parse requirement" in s["message"]


def test_many_concurrent_watchers_each_see_every_event(server, api):
    import asyncio
    import json

    import aiohttp

    core = client.CoreV1Api(api)
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    n_watchers, n_objects = 40, 15

    async def watcher(session: aiohttp.ClientSession) -> list[str]:
        names = []
        url = f"{server.url}/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=20"
        async with session.get(url) as resp:
            async for line in resp.content:
                names.append(json.loads(line)["object"]["metadata"]["name"])
                if len(names) == n_objects:
                    break
        return names

    async def main() -> list[list[str]]:
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(watcher(session)) for _ in range(n_watchers)]
            await asyncio.sleep(
                0
            )  # the watches start; creating before they connect is fine too (history replay)
            await asyncio.to_thread(
                lambda: [
                    core.create_namespaced_config_map(NS, {"metadata": {"name": f"c{i}"}})
                    for i in range(n_objects)
                ]
            )
            return await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

    results = asyncio.run(main())
    assert all(r == [f"c{i}" for i in range(n_objects)] for r in results)
