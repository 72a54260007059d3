"""Subresources, one entry each: where it is served, what discovery says of it and its handler per HTTP method
(discovery's verbs follow from those methods). Discovery (discovery.py) and dispatch (routing.py) read only this
table, so a new subresource is one entry here plus its handler.

Not served: pods/exec, attach, portforward and proxy (a pod's containers are processes on this machine).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from ftjob_trainer.contract import format_time

from . import pods, scale
from .calls import Call, Handler
from .errors import bad_request, method_not_allowed
from .resources import POD_KEY, SA_KEY, Key, ResourceType
from .wire import json_response, path_not_found

VERB_OF_METHOD = {"GET": "get", "PATCH": "patch", "POST": "create", "PUT": "update"}
UNSUPPORTED_POD_SUBRESOURCES = ("exec", "attach", "portforward", "proxy")


@dataclass(frozen=True)
class Subresource:
    name: str
    served_on: Callable[[ResourceType, str], bool]  # (type, version) -> whether it has this subresource
    methods: dict[str, Handler]  # HTTP method -> handler
    kind: str = ""  # what it reads or writes; "": the parent's kind
    group_version: str = ""  # of `kind`, when it is not the parent's (e.g. "autoscaling/v1")

    def verbs(self) -> list[str]:
        return sorted(VERB_OF_METHOD[m] for m in self.methods)

    def discovery(self, rt: ResourceType) -> dict[str, Any]:
        """Its entry in the APIResourceList of its parent's group version."""
        entry: dict[str, Any] = {
            "name": f"{rt.plural}/{self.name}",
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": self.kind or rt.kind,
            "verbs": self.verbs(),
        }
        if self.group_version:
            group, version = self.group_version.split("/")
            entry.update(group=group, version=version)
        return entry


def _on(*keys: Key) -> Callable[[ResourceType, str], bool]:
    return lambda rt, version: rt.key in keys


# ---------------------------------------------------------------- handlers
async def _get_status(call: Call) -> web.StreamResponse:
    obj = call.objects.get(call.rt, call.ns, call.named())
    return json_response(call.objects.out(call.rt, call.version, obj))


async def _put_status(call: Call) -> web.StreamResponse:
    body = await call.body()
    obj = call.objects.update(call.rt, call.version, call.ns, call.named(), body, call.params, "status")
    return json_response(call.objects.out(call.rt, call.version, obj))


async def _patch_status(call: Call) -> web.StreamResponse:
    body = await call.body()
    obj, _ = call.objects.patch(
        call.rt, call.version, call.ns, call.named(), body, call.request.content_type, call.params, "status"
    )
    return json_response(call.objects.out(call.rt, call.version, obj))


async def _get_scale(call: Call) -> web.StreamResponse:
    return json_response(
        scale.scale_of(call.rt, call.version, call.objects.get(call.rt, call.ns, call.named()))
    )


async def _set_scale(call: Call) -> web.StreamResponse:
    body = await call.body()
    new_scale = scale.set_scale(
        call.objects,
        call.rt,
        call.version,
        call.ns,
        call.named(),
        body,
        call.method,
        call.request.content_type,
        call.params,
    )
    return json_response(new_scale)


async def _get_log(call: Call) -> web.StreamResponse:
    logs_dir = call.backend.logs_dir(call.ns, call.named())
    return await pods.pod_log(call.request, call.objects, logs_dir, call.ns, call.named())


async def _create_eviction(call: Call) -> web.StreamResponse:
    return json_response(pods.evict(call.objects, call.ns, call.named(), await call.body()), 201)


async def _create_binding(call: Call) -> web.StreamResponse:
    return json_response(pods.bind(call.objects, call.ns, call.named(), await call.body()), 201)


async def _create_token(call: Call) -> web.StreamResponse:
    """A ServiceAccount token (`kubectl create token SA`), signed by this server (see auth.Tokens)."""
    name, body = call.named(), await call.body()
    sa = call.objects.get(call.rt, call.ns, name)
    spec = (body or {}).get("spec") or {}
    expires = int(spec.get("expirationSeconds") or 3600)
    deadline = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=expires)
    token_request = {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": call.ns, "creationTimestamp": None},
        "spec": {"audiences": spec.get("audiences") or [], "expirationSeconds": expires},
        "status": {
            "token": call.backend.tokens.issue(call.ns, name, sa["metadata"]["uid"], expires),
            "expirationTimestamp": format_time(deadline),
        },
    }
    return json_response(token_request, 201)


# ---------------------------------------------------------------- the table
SUBRESOURCES: tuple[Subresource, ...] = (
    Subresource(
        "status",
        lambda rt, version: rt.has_status(version),
        {"GET": _get_status, "PUT": _put_status, "PATCH": _patch_status},
    ),
    Subresource(
        "scale",
        lambda rt, version: rt.scale_spec(version) is not None,
        {"GET": _get_scale, "PUT": _set_scale, "PATCH": _set_scale},
        kind="Scale",
        group_version="autoscaling/v1",
    ),
    Subresource("log", _on(POD_KEY), {"GET": _get_log}),
    Subresource("eviction", _on(POD_KEY), {"POST": _create_eviction}, "Eviction", "policy/v1"),
    Subresource("binding", _on(POD_KEY), {"POST": _create_binding}, "Binding"),
    Subresource("token", _on(SA_KEY), {"POST": _create_token}, "TokenRequest", "authentication.k8s.io/v1"),
)


def served(rt: ResourceType, version: str) -> list[Subresource]:
    """The subresources of `rt` at `version`, in table order."""
    return [s for s in SUBRESOURCES if s.served_on(rt, version)]


async def serve_subresource(call: Call, name: str) -> web.StreamResponse:
    """Dispatch a request for `<object>/<name>` to its handler (404 when the type has no such subresource, 405
    when the subresource does not take the method)."""
    if call.rt.key == POD_KEY and name in UNSUPPORTED_POD_SUBRESOURCES:
        raise bad_request(
            f"pods/{name} is not supported by the ftjob local cluster: a pod's containers are "
            f"processes on this machine (see `kubectl logs {call.name}`; their output is under "
            f"{call.backend.logs_dir(call.ns, call.named())})"
        )
    entry = next((s for s in served(call.rt, call.version) if s.name == name), None)
    if entry is None:
        raise path_not_found(call.request)
    handler = entry.methods.get(call.method)
    if handler is None:
        raise method_not_allowed(
            f"{call.method} is not supported on {call.rt.plural}/{name} (it supports {', '.join(entry.verbs())})"
        )
    return await handler(call)
