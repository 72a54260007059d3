"""Watch: a chunked stream of ADDED/MODIFIED/DELETED events for one type, from a resourceVersion on (or from the
current state), with periodic BOOKMARKs and `410 Gone` once the asked-for history has been dropped. Selectors apply
to the object before and after each change, so an object that stops matching is seen as DELETED."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from . import tables
from .errors import ApiError, bad_request
from .objects import Objects, served
from .resources import ResourceType
from .selectors import Matcher, object_matcher
from .store import CLOSE_WATCH, Event
from .wire import dumps, truthy

BOOKMARK_EVERY_S = 5.0


def _as_seen(ev: Event, match: Matcher) -> tuple[str, dict[str, Any]] | None:
    """What a watcher with this selector sees of the event (None: nothing)."""
    new_m = match(ev.new)
    old_m = ev.old is not None and match(ev.old)
    if ev.type == "DELETED":
        return ("DELETED", ev.new) if (new_m or old_m) else None
    if new_m and old_m:
        return ("MODIFIED", ev.new)
    if new_m:
        return ("ADDED", ev.new)
    if old_m:
        return ("DELETED", ev.new)
    return None


def _bookmark(rt: ResourceType, version: str, rv: int, initial_end: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"kind": rt.kind, "apiVersion": rt.api_version(version), "metadata": meta}


async def serve_watch(
    request: web.Request,
    objects: Objects,
    rt: ResourceType,
    version: str,
    ns: str | None,
    name: str | None = None,
) -> web.StreamResponse:
    """`name`: the legacy watch of one object."""
    store = objects.store
    params = request.query
    match = object_matcher(params, ns, name)
    as_table = "as=Table" in request.headers.get("Accept", "")
    include_object = params.get("includeObject", "Metadata")
    bookmarks = truthy(params.get("allowWatchBookmarks"))
    timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
    rv_param = params.get("resourceVersion") or ""
    send_initial = truthy(params.get("sendInitialEvents"))
    queue = store.subscribe(rt.key)  # before reading history: nothing falls between the two
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
    )
    resp.enable_chunked_encoding()
    first = True

    def encode(etype: str, obj: dict[str, Any]) -> bytes:
        nonlocal first
        shown = served(rt, version, obj)
        if as_table and etype != "BOOKMARK" and etype != "ERROR":
            shown = tables.to_table(
                rt,
                version,
                [shown],
                shown["metadata"].get("resourceVersion", ""),
                include_object,
                headers=first,
            )
            first = False
        return (dumps({"type": etype, "object": shown}) + "\n").encode()

    try:
        await resp.prepare(request)
        last_rv = store.rv
        if rv_param in ("", "0") or send_initial:
            initial = [encode("ADDED", obj) for obj in objects.select(rt, ns, params, name)]
            await (
                store.durable()
            )  # the listing may hold this loop iteration's writes: show them once committed
            await resp.write(b"".join(initial))
            if send_initial:
                await resp.write(encode("BOOKMARK", _bookmark(rt, version, last_rv, initial_end=True)))
        else:
            try:
                since = int(rv_param)
            except ValueError as e:
                raise bad_request(f"invalid resourceVersion {rv_param!r}: it must be a number") from e
            events = store.events_since(since, rt.key)
            last_rv = store.emitted_rv  # later events (some written already, not yet committed) come queued
            if events is None:
                gone = ApiError(
                    410, "Expired", f"too old resource version: {since} ({store.history_start(rt.key)})"
                )
                await resp.write((dumps({"type": "ERROR", "object": gone.status()}) + "\n").encode())
                return resp
            for ev in events:
                out = _as_seen(ev, match)
                if out:
                    await resp.write(encode(*out))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        next_bookmark = loop.time() + BOOKMARK_EVERY_S
        while True:
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            wait = min(x for x in (deadline, next_bookmark) if x is not None) - now
            try:
                ev = await asyncio.wait_for(queue.get(), timeout=max(wait, 0.01))
            except asyncio.TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    break
                if loop.time() >= next_bookmark:
                    next_bookmark = loop.time() + BOOKMARK_EVERY_S
                    if bookmarks:
                        await resp.write(encode("BOOKMARK", _bookmark(rt, version, store.rv)))
                continue
            if ev is CLOSE_WATCH:
                break
            if ev.rv <= last_rv:
                continue
            out = _as_seen(ev, match)
            if out:
                await resp.write(encode(*out))
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass
    finally:
        store.unsubscribe(rt.key, queue)
    return resp
