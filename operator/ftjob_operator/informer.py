"""Watch-fed caches of the jobs' children (pods, Services and, without a token key, Secrets): each reconcile pass
reads its job's children from memory instead of listing them, so its cost depends on the job, not on the cluster.

An `Informer` keeps one kind's objects that carry the job-name label, for one namespace or the whole cluster:
list (in pages), then watch from the list's resourceVersion. A watch that ends (the server's timeout, a dropped
connection) resumes from the last resourceVersion seen (bookmarks keep it recent). A `410 Gone` (the history it
would resume from was compacted) lists again and *replaces* the cache: an object missing from the new listing is
dropped, and its job woken, as client-go's Reflector does. kopf's indexes were not used for this: after a 410 kopf
lists again but keeps every indexed object whose DELETED event fell into the gap (its watcher only adds what the
new listing holds), so a pod deleted then would stay in the cache for good.

`JobChildren` holds the informers; `synced()` is set once every informer has listed since the operator started,
and the handlers wait for it before their first pass, so no job is planned from an empty cache. Reading a cache
that has not listed yet raises `NotSynced` (a `kopf.TemporaryError`) rather than answering "no pods": a pass that
got there anyway is retried instead of re-creating the job's pods.

Objects are kept trimmed to what the planner reads (`trim`): a cache of 15,000 pods holds their metadata, node
name and status, not their containers.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import kopf

from . import render
from .kube import ApiFailure, Kube

log = logging.getLogger(__name__)

Obj = dict[str, Any]
WATCH_TIMEOUT_SECONDS = 300  # each watch asks the server to end it after about this long (then resumes)
RETRY_SECONDS = 1.0  # after a failed list or watch (the API server restarting, a network error)
PAGE = 500  # objects per list page
PLURALS = {"Pod": "pods", "Service": "services", "Secret": "secrets"}  # the kinds a cache may hold

Waker = Callable[[str, str], None]  # (namespace, job name) of a job whose children changed


def trim(kind: str, obj: Obj) -> Obj:
    """What the operator reads of a child: metadata (without managedFields), and of its spec only the pod's node or
    the Service's address; a pod's status; of a Secret only the token."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    spec = obj.get("spec") or {}
    if kind == "pods":
        return {
            "metadata": meta,
            "spec": {"nodeName": spec.get("nodeName")},
            "status": obj.get("status") or {},
        }
    if kind == "services":
        return {"metadata": meta, "spec": {"clusterIP": spec.get("clusterIP")}}
    if kind == "secrets":
        token = (obj.get("data") or {}).get(render.TOKEN_KEY)
        return {"metadata": meta, "data": {render.TOKEN_KEY: token} if token else {}}
    return {**obj, "metadata": meta}


def _ref(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _job_of(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", (meta.get("labels") or {}).get(render.LABEL_JOB_NAME) or ""


class WatchExpired(Exception):
    """410 Gone: the watch cannot resume; list again."""


class NotSynced(kopf.TemporaryError):
    """A read of a cache that has not listed since the operator started: it would answer "none" for everything."""

    def __init__(self, path: str):
        super().__init__(f"the cache of {path} has not listed yet", delay=RETRY_SECONDS)


class Informer:
    """One kind's labelled objects, kept current by list + watch; `on_change` hears of each job whose children
    changed. Read it with `of_job` and `get`."""

    def __init__(self, kube: Kube, kind: str, namespace: str | None, on_change: Waker):
        self.kube, self.kind, self.on_change = kube, kind, on_change
        self.path = f"/api/v1/namespaces/{namespace}/{kind}" if namespace else f"/api/v1/{kind}"
        self.selector = render.LABEL_JOB_NAME  # every child carries it
        self.by_uid: dict[str, Obj] = {}
        self.by_job: dict[tuple[str, str], dict[str, Obj]] = {}  # (namespace, job name) -> uid -> object
        self.by_name: dict[tuple[str, str], Obj] = {}
        self.synced = asyncio.Event()
        self.listings = 0  # how many times it listed (the first, then after each 410)
        # The version to resume from: the list's, then each event's. Kept across a dropped stream, so a reconnect
        # replays only what came after the last event applied. None: list (first, and after a 410).
        self.resource_version: str | None = None

    # --- reads ----------------------------------------------------------------------------------------------------
    def of_job(self, namespace: str, job: str) -> list[Obj]:
        self._check_synced()
        return list(self.by_job.get((namespace, job), {}).values())

    def get(self, namespace: str, name: str) -> Obj | None:
        self._check_synced()
        return self.by_name.get((namespace, name))

    def _check_synced(self) -> None:
        if not self.synced.is_set():
            raise NotSynced(self.path)

    # --- the cache ------------------------------------------------------------------------------------------------
    def remember(self, obj: Obj) -> None:
        """An object this process has just created, as the API server answered: in the cache at once, so the job's
        next pass does not create it again before the watch brings it (client-go's MutationCache does the same).
        Its ADDED event then finds the same version and wakes no one; a relist that lacks it drops it as usual."""
        if obj["metadata"]["uid"] not in self.by_uid:
            self._put(trim(self.kind, obj), wake=False)

    def _put(self, obj: Obj, wake: bool = True) -> None:
        uid = obj["metadata"]["uid"]
        old = self.by_uid.get(uid)
        if old is not None:
            if old["metadata"].get("resourceVersion") == obj["metadata"].get("resourceVersion"):
                return  # the version already held (an object remembered at its creation): nothing changed
            self._drop(old)
        self.by_uid[uid] = obj
        self.by_job.setdefault(_job_of(obj), {})[uid] = obj
        self.by_name[_ref(obj)] = obj
        if not wake:
            return
        if old is not None and _job_of(old) != _job_of(obj):
            self.on_change(*_job_of(old))
        self.on_change(*_job_of(obj))

    def _drop(self, obj: Obj) -> None:
        uid = obj["metadata"]["uid"]
        self.by_uid.pop(uid, None)
        group = self.by_job.get(_job_of(obj))
        if group is not None:
            group.pop(uid, None)
            if not group:
                del self.by_job[_job_of(obj)]
        if (self.by_name.get(_ref(obj)) or {}).get("metadata", {}).get("uid") == uid:
            del self.by_name[_ref(obj)]

    def _delete(self, obj: Obj) -> None:
        known = self.by_uid.get(obj["metadata"]["uid"])
        if known is not None:
            self._drop(known)
            self.on_change(*_job_of(known))

    def replace(self, listed: list[Obj]) -> None:
        """The cache becomes exactly `listed`: what is missing from it is dropped (deleted while not watched)."""
        fresh = {o["metadata"]["uid"]: o for o in listed}
        for uid, obj in list(self.by_uid.items()):
            if uid not in fresh:
                self._drop(obj)
                self.on_change(*_job_of(obj))
        for uid, obj in fresh.items():
            known = self.by_uid.get(uid)
            if known is None or known["metadata"].get("resourceVersion") != obj["metadata"].get(
                "resourceVersion"
            ):
                self._put(obj)

    # --- list + watch ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Forever: list, then watch and resume; list again after a 410. Cancel the task to stop it."""
        while True:
            try:
                if self.resource_version is None:
                    self.resource_version = await self._list()
                await self._watch()
            except WatchExpired:
                log.info("%s: the watch history is gone (410); listing again", self.path)
                self.resource_version = None
            except (kopf.TemporaryError, kopf.PermanentError, ApiFailure) as exc:
                log.warning("%s: %s; retrying in %.0f s", self.path, exc, RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)

    async def _list(self) -> str:
        listed: list[Obj] = []
        rv = ""
        async for page, page_rv in self.kube.list_pages(self.path, self.selector, PAGE):
            # The first page's version: a watch from it replays whatever changed while later pages were read.
            rv = rv or page_rv
            listed += [trim(self.kind, o) for o in page]
        self.replace(listed)
        self.listings += 1
        self.synced.set()
        return rv

    async def _watch(self) -> None:
        """One watch from `resource_version` until the stream ends, advancing it with each event applied."""
        timeout = WATCH_TIMEOUT_SECONDS + random.randint(0, 60)  # spread the informers' reconnects
        query = [
            ("labelSelector", self.selector),
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
        ]
        try:
            async for event in self.kube.watch(self.path, query, timeout):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired()
                    raise ApiFailure(f"watch {self.path}", int(obj.get("code") or 500), "", str(obj))
                if kind in ("ADDED", "MODIFIED"):
                    self._put(trim(self.kind, obj))
                elif kind == "DELETED":
                    self._delete(obj)
                self.resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion"
                ) or self.resource_version
        except ApiFailure as exc:
            if exc.status == 410:
                raise WatchExpired() from exc
            raise


class JobChildren:
    """The informers of the jobs' children in the operator's namespaces (all namespaces when none are given)."""

    def __init__(self, kube: Kube, namespaces: list[str], on_change: Waker, secrets: bool):
        kinds = ["pods", "services"] + (["secrets"] if secrets else [])
        self.informers: dict[tuple[str, str | None], Informer] = {
            (kind, ns): Informer(kube, kind, ns, on_change) for kind in kinds for ns in (namespaces or [None])
        }
        self.cluster_wide = not namespaces
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(i.run(), name=f"informer {i.path}") for i in self.informers.values()
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers.values())

    async def wait_synced(self) -> None:
        for informer in self.informers.values():
            await informer.synced.wait()

    def _informer(self, kind: str, namespace: str) -> Informer | None:
        return self.informers.get((kind, None if self.cluster_wide else namespace))

    def pods(self, namespace: str, job: str) -> list[Obj]:
        informer = self._informer("pods", namespace)
        return informer.of_job(namespace, job) if informer else []

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        informer = self._informer(kind, namespace)
        return informer.get(namespace, name) if informer else None

    def remember(self, kind: str, obj: Obj) -> None:
        """A child just created (`kind` as in its manifest: Pod, Service, ...), when a cache holds its kind."""
        plural = PLURALS.get(kind)
        informer = (
            self._informer(plural, (obj.get("metadata") or {}).get("namespace") or "") if plural else None
        )
        if informer is not None:
            informer.remember(obj)

    def watches(self, kind: str) -> bool:
        return any(k == kind for k, _ in self.informers)
