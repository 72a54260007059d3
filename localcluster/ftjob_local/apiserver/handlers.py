"""The endpoints of a resource and of one object: list (pages, Tables, metadata-only), watch, create, get,
replace, patch, delete and delete a collection. COLLECTION and OBJECT map each HTTP method to its handler;
subresources have their own table (subresources.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

from . import tables
from .calls import Call, Handler
from .errors import bad_request
from .objects import served
from .watch import serve_watch
from .wire import dumps, json_response, pop_warnings, truthy


def delete_options(params: Any, body: Any) -> dict[str, Any]:
    """DeleteOptions from the body, overridden by the query parameters of the same names."""
    opts = dict(body) if isinstance(body, dict) else {}
    if params.get("gracePeriodSeconds") is not None:
        opts["gracePeriodSeconds"] = int(params["gracePeriodSeconds"])
    if params.get("propagationPolicy"):
        opts["propagationPolicy"] = params["propagationPolicy"]
    if params.get("orphanDependents") is not None:
        opts["orphanDependents"] = truthy(params["orphanDependents"])
    if params.get("dryRun"):
        opts["dryRun"] = [params["dryRun"]]
    return opts


def _list_body(call: Call) -> dict[str, Any]:
    rt, version, params = call.rt, call.version, call.params
    items = call.objects.select(rt, call.ns or None, params)
    rv = str(call.objects.store.rv)
    meta: dict[str, Any] = {"resourceVersion": rv}
    limit = int(params.get("limit") or 0)
    cont = params.get("continue")
    if cont:
        try:
            start = json.loads(base64.urlsafe_b64decode(cont.encode()))
        except ValueError as e:
            raise bad_request(f"invalid continue token {cont!r}: list again without it") from e
        after = (start["ns"], start["name"])
        items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after]
    if limit and len(items) > limit:
        last = items[limit - 1]["metadata"]
        meta["continue"] = base64.urlsafe_b64encode(
            dumps({"ns": last.get("namespace", ""), "name": last["name"]}).encode()
        ).decode()
        meta["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    accept = call.request.headers.get("Accept", "")
    if "as=Table" in accept:
        table = tables.to_table(rt, version, items, rv, params.get("includeObject", "Metadata"))
        table["metadata"].update({k: v for k, v in meta.items() if k != "resourceVersion"})
        if "v=v1;" not in accept + ";" and "v=v1beta1" in accept:
            table["apiVersion"] = "meta.k8s.io/v1beta1"
        return table
    if "as=PartialObjectMetadataList" in accept:
        return {
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
            "items": [tables.partial_metadata(o) for o in items],
        }
    return {
        "kind": rt.list_kind,
        "apiVersion": rt.api_version(version),
        "metadata": meta,
        "items": [served(rt, version, o) for o in items],
    }


async def _list_or_watch(call: Call) -> web.StreamResponse:
    if call.watch:
        return await serve_watch(call.request, call.objects, call.rt, call.version, call.ns or None)
    return json_response(_list_body(call))


async def _create(call: Call) -> web.StreamResponse:
    obj = call.objects.create(call.rt, call.version, call.ns, await call.body(), call.params)
    return json_response(served(call.rt, call.version, obj), 201, pop_warnings(obj))


async def _delete_collection(call: Call) -> web.StreamResponse:
    opts = delete_options(call.params, await call.body())
    return json_response(
        call.objects.delete_collection(call.rt, call.version, call.ns or None, call.params, opts)
    )


async def _get_or_watch(call: Call) -> web.StreamResponse:
    rt, version, params = call.rt, call.version, call.params
    if call.watch:  # the legacy watch of one object
        return await serve_watch(call.request, call.objects, rt, version, call.ns or None, call.name)
    obj = served(rt, version, call.objects.get(rt, call.ns, call.named()))
    if "as=Table" in call.request.headers.get("Accept", ""):
        rv = obj["metadata"]["resourceVersion"]
        return json_response(tables.to_table(rt, version, [obj], rv, params.get("includeObject", "Metadata")))
    return json_response(obj)


async def _replace(call: Call) -> web.StreamResponse:
    body = await call.body()
    obj = call.objects.update(call.rt, call.version, call.ns, call.named(), body, call.params)
    return json_response(served(call.rt, call.version, obj), 200, pop_warnings(obj))


async def _patch(call: Call) -> web.StreamResponse:
    body = await call.body()
    obj, created = call.objects.patch(
        call.rt, call.version, call.ns, call.named(), body, call.request.content_type, call.params
    )
    return json_response(served(call.rt, call.version, obj), 201 if created else 200, pop_warnings(obj))


async def _delete(call: Call) -> web.StreamResponse:
    opts = delete_options(call.params, await call.body())
    obj = call.objects.delete(call.rt, call.ns, call.named(), opts)
    return json_response(served(call.rt, call.version, obj))


COLLECTION: dict[str, Handler] = {"GET": _list_or_watch, "POST": _create, "DELETE": _delete_collection}
OBJECT: dict[str, Handler] = {"GET": _get_or_watch, "PUT": _replace, "PATCH": _patch, "DELETE": _delete}
