"""The bottom layer of the local cluster's clients: JSON requests, a list+watch cache (informer), polling.

A thin dict-based layer over the official kubernetes client. The kubelet and scheduler work on raw JSON objects (as
the API server stores them), so requests go through the official client's configuration, auth and connection pool
(`ApiClient.param_serialize` / `call_api`) without its typed models. Imports nothing of ftjob_local.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
Obj = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer of the API server, with its Status message."""

    def __init__(self, status: int, message: str, reason: str = ""):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Kube:
    """JSON requests against the API server named by a kubeconfig."""

    def __init__(self, kubeconfig: str):
        self.client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))

    def _send(self, method: str, path: str, query: dict | None, body: Any, content_type: str | None, timeout):
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()]
        m, url, hdrs, b, _ = self.client.param_serialize(
            method,
            path,
            query_params=params or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.client.call_api(m, url, header_params=hdrs, body=b, _request_timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float = 30,
    ) -> Obj:
        resp = self._send(method, path, query, body, content_type, timeout)
        data = resp.read()
        if not 200 <= resp.status < 300:
            raise _error(resp.status, data)
        return json.loads(data) if data else {}

    # --- conveniences -------------------------------------------------------------------------------------
    def get(self, path: str) -> Obj | None:
        try:
            return self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def merge_patch(self, path: str, body: Obj) -> Obj:
        return self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    def delete(self, path: str, grace: int | None = None, uid: str | None = None) -> Obj | None:
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            return self.request("DELETE", path, body=body)
        except ApiError as e:
            if e.status in (404, 409):  # gone already, or a newer object took the name
                return None
            raise

    def watch(self, path: str, resource_version: str, timeout_seconds: int = 60) -> Iterator[Obj]:
        """Yields watch events (dicts with type and object); raises ApiError(410) when the version is too old."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        }
        resp = self._send("GET", path, query, None, None, (10, timeout_seconds + 15))
        try:
            if not 200 <= resp.status < 300:
                raise _error(resp.status, resp.read())
            for line in iter_resp_lines(resp.response):
                if not line:
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError(
                        int(status.get("code") or 500), status.get("message", ""), status.get("reason", "")
                    )
                yield event
        finally:
            resp.response.release_conn()


def _error(status: int, data: bytes) -> ApiError:
    try:
        doc = json.loads(data)
        return ApiError(status, doc.get("message", ""), doc.get("reason", ""))
    except (ValueError, AttributeError):
        return ApiError(status, (data or b"").decode(errors="replace")[:500])


def key_of(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class Informer:
    """Keeps a cache of one resource (list, then watch from its resourceVersion; relist on 410 or errors).

    Every change calls the listeners with (event type, object); consumers re-read the cache, so a listener only
    has to wake them up.
    """

    def __init__(self, kube: Kube, path: str, name: str):
        self.kube, self.path, self.name = kube, path, name
        self._cache: dict[tuple[str, str], Obj] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        self.listeners: list[Callable[[str, Obj], None]] = []
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._cache.values())

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._cache.get((namespace, name))

    def _notify(self, kind: str, obj: Obj) -> None:
        for listener in self.listeners:
            try:
                listener(kind, obj)
            except Exception:  # a listener bug must not stop the cache
                log.exception("listener of %s failed", self.name)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rv = self._relist()
                while not self._stop.is_set():
                    for event in self.kube.watch(self.path, rv):
                        obj = event.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        kind = event.get("type")
                        if kind == "BOOKMARK":
                            continue
                        with self._lock:
                            if kind == "DELETED":
                                self._cache.pop(key_of(obj), None)
                            else:
                                self._cache[key_of(obj)] = obj
                        self._notify(kind, obj)
                        if self._stop.is_set():
                            return
            except ApiError as e:
                if e.status != 410:
                    log.warning("watch %s: %s", self.path, e)
                    self._stop.wait(1)
            except Exception as e:  # connection refused/reset while the API server restarts
                if not self._failing:
                    log.warning("watch %s: %s (retrying every second)", self.path, e)
                self._failing = True
                self._stop.wait(1)

    def _relist(self) -> str:
        doc = self.kube.request("GET", self.path)
        if self._failing:
            log.info("watch %s: connected again", self.path)
            self._failing = False
        fresh = {key_of(o): o for o in doc.get("items") or []}
        with self._lock:
            gone = [o for k, o in self._cache.items() if k not in fresh]
            self._cache = fresh
        for obj in gone:
            self._notify("DELETED", obj)
        for obj in fresh.values():
            self._notify("MODIFIED", obj)
        self.synced.set()
        return (doc.get("metadata") or {}).get("resourceVersion", "0")


def wait_for(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Polls predicate until it returns something truthy; raises TimeoutError naming what it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
