"""The API server's store: indexed selections answer what a scan would, writes commit in batches before anyone
hears of them, and a crash loses only unanswered writes without reusing their resourceVersions."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import uuid
from pathlib import Path

import pytest
from ftjob_local.apiserver.resources import INDEXED_FIELDS, POD_KEY
from ftjob_local.apiserver.selectors import index_terms, object_matcher
from ftjob_local.apiserver.store import Store, sort_objects


def pod(store: Store, ns: str, name: str, labels: dict[str, str], node: str = "") -> dict:
    obj = {
        "metadata": {"namespace": ns, "name": name, "uid": str(uuid.uuid4()), "labels": labels},
        "spec": {"nodeName": node} if node else {},
    }
    obj["metadata"]["resourceVersion"] = str(store.next_rv())
    store.put(POD_KEY, obj, None)
    return obj


@pytest.fixture
def store(tmp_path: Path):
    s = Store(str(tmp_path / "state"), INDEXED_FIELDS)
    yield s
    s.close()


def fill(store: Store) -> None:
    for i, ns in itertools.product(range(30), ("a", "b")):
        labels = {"job": f"j{i % 7}", "role": "worker" if i % 3 else "coordinator"}
        if i % 5 == 0:
            labels["spare"] = "yes"
        pod(store, ns, f"p{i}", labels, node=f"n{i % 4}" if i % 2 else "")


SELECTIONS = [
    ("a", {}),
    (None, {"labelSelector": "job=j3"}),
    ("b", {"labelSelector": "job=j3,role=worker"}),
    ("a", {"labelSelector": "job==j1,role!=worker"}),
    (None, {"labelSelector": "spare"}),
    (None, {"labelSelector": "!spare,job in (j2)"}),
    (None, {"labelSelector": "job in (j2,j4)"}),
    (None, {"labelSelector": "job notin (j2,j4)"}),
    (None, {"fieldSelector": "spec.nodeName=n1"}),
    ("b", {"fieldSelector": "spec.nodeName=n3,metadata.name!=p3", "labelSelector": "role=worker"}),
    (None, {"fieldSelector": "metadata.namespace=b", "labelSelector": "job=j0"}),
    (None, {"labelSelector": "job=nope"}),
]


@pytest.mark.parametrize("ns,params", SELECTIONS)
def test_indexed_selection_is_what_a_scan_selects(store: Store, ns, params):
    fill(store)
    match = object_matcher(params, ns)
    scanned = [o for o in store.list(POD_KEY) if match(o)]
    terms = index_terms(params)
    candidates = store.kind(POD_KEY).candidates(ns, terms.labels, terms.label_keys, terms.fields)
    assert sort_objects(o for o in candidates if match(o)) == scanned


def test_a_label_equality_reads_only_the_objects_with_that_label(store: Store):
    fill(store)
    for i in range(200):  # other jobs' pods must not be visited
        pod(store, "a", f"other-{i}", {"job": f"other-{i}"})
    found = store.kind(POD_KEY).candidates("a", labels=[("job", "j3")])
    assert sorted(o["metadata"]["name"] for o in found) == ["p10", "p17", "p24", "p3"]
    # an update that moves a pod to another job moves it between the index entries
    moved = dict(store.get(POD_KEY, "a", "p3"), metadata={**store.get(POD_KEY, "a", "p3")["metadata"]})
    moved["metadata"]["labels"] = {"job": "j4"}
    moved["metadata"]["resourceVersion"] = str(store.next_rv())
    store.put(POD_KEY, moved, store.get(POD_KEY, "a", "p3"))
    assert "p3" not in {o["metadata"]["name"] for o in store.kind(POD_KEY).candidates("a", [("job", "j3")])}
    assert "p3" in {o["metadata"]["name"] for o in store.kind(POD_KEY).candidates("a", [("job", "j4")])}


def _committed(state: Path) -> set[str]:
    db = sqlite3.connect(str(state / "objects.sqlite"))
    try:
        return {name for (name,) in db.execute("SELECT name FROM objects")}
    finally:
        db.close()


def test_writes_of_one_loop_iteration_commit_together_before_watchers_hear_of_them(tmp_path: Path):
    state = tmp_path / "state"
    store = Store(str(state), INDEXED_FIELDS)
    commits: list[str] = []
    store.db.set_trace_callback(lambda sql: commits.append(sql) if sql.strip() == "COMMIT" else None)

    async def main() -> None:
        queue = store.subscribe(POD_KEY)
        for i in range(50):
            pod(store, "a", f"p{i}", {"job": "j"})
        assert queue.empty() and _committed(state) == set()  # nothing committed, nothing told
        await store.durable()
        assert _committed(state) == {f"p{i}" for i in range(50)}
        assert [queue.get_nowait().new["metadata"]["name"] for _ in range(50)] == [f"p{i}" for i in range(50)]

    try:
        asyncio.run(main())
        assert len(commits) == 1
    finally:
        store.close()


def test_a_crash_loses_only_uncommitted_writes_and_their_versions_are_not_reused(tmp_path: Path, monkeypatch):
    state = tmp_path / "state"
    store = Store(str(state), INDEXED_FIELDS)
    pod(store, "a", "kept", {})  # no event loop: committed at once
    lost_rv = 0

    async def write_and_crash() -> None:
        nonlocal lost_rv
        # the process dies before the loop runs the commit: no request was answered
        monkeypatch.setattr(store, "flush", lambda: None)
        lost_rv = int(pod(store, "a", "lost", {})["metadata"]["resourceVersion"])

    asyncio.run(write_and_crash())
    store.db.close()
    store._lock.close()  # the kernel drops a dead process's lock
    again = Store(str(state), INDEXED_FIELDS)
    try:
        assert again.get(POD_KEY, "a", "kept") is not None
        assert again.get(POD_KEY, "a", "lost") is None
        assert again.next_rv() > lost_rv
    finally:
        again.close()
    # a clean stop leaves no gap: the next start continues right after the last version
    rv = Store(str(state), INDEXED_FIELDS)
    last = rv.rv
    rv.close()
    assert Store(str(state), INDEXED_FIELDS).rv == last


def test_compaction_makes_older_versions_gone_and_watch_history_is_per_kind(store: Store):
    fill(store)
    before = store.rv
    assert store.events_since(before - 3, POD_KEY) is not None
    assert len(store.events_since(before - 3, POD_KEY)) == 3
    assert store.events_since(before - 3, ("", "configmaps")) == []
    store.compact()
    assert store.events_since(before - 3, POD_KEY) is None
    assert store.events_since(store.rv, POD_KEY) == []


def test_the_server_counts_requests_by_verb_and_resource(tmp_path: Path):
    import json
    import urllib.request

    from ftjob_local.apiserver import start_in_thread

    handle = start_in_thread(str(tmp_path / "state"))
    try:

        def call(method: str, path: str, body: dict | None = None) -> str:
            data = json.dumps(body).encode() if body is not None else None
            req = urllib.request.Request(handle.url + path, data=data, method=method)
            req.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.read().decode()

        call("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "c"}})
        for _ in range(3):
            call("GET", "/api/v1/namespaces/default/pods?labelSelector=a%3Db")
        call("GET", "/api/v1/namespaces/default/configmaps/c")
        metrics = call("GET", "/metrics").splitlines()
        assert 'apiserver_request_total{verb="LIST",group="",resource="pods",subresource=""} 3' in metrics
        assert (
            'apiserver_request_total{verb="CREATE",group="",resource="configmaps",subresource=""} 1'
            in metrics
        )
        assert (
            'apiserver_request_total{verb="GET",group="",resource="configmaps",subresource=""} 1' in metrics
        )
    finally:
        handle.stop()
