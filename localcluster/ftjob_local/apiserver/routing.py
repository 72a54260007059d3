"""URL -> handler. Non-resource paths (health, /version, discovery, OpenAPI) are answered here; a resource path
(/api/v1/... or /apis/<group>/<version>/...) is parsed into a `Call`, authorized, and handed to the endpoints of
handlers.COLLECTION / handlers.OBJECT, to the subresource table, or to the two resources that are answered but
never stored (access reviews, bindings)."""

from __future__ import annotations

import collections

from aiohttp import web

from . import discovery, openapi, pods
from .auth import User, access_review, authenticate, forbidden_message, rbac_allows
from .calls import Backend, Call
from .errors import ApiError, forbidden, method_not_allowed
from .handlers import COLLECTION, OBJECT
from .resources import Registry
from .subresources import serve_subresource
from .wire import json_response, path_not_found, read_body, truthy

_VERB_OF_METHOD = {"POST": "create", "PUT": "update", "PATCH": "patch"}


class Router:
    def __init__(self, backend: Backend):
        self.backend = backend
        self.address = ""  # host:port the clients reach us at (discovery's serverAddressByClientCIDRs)
        # Resource requests served, as kube-apiserver's apiserver_request_total counts them: (VERB, group,
        # resource, subresource) -> count; GET /metrics shows them.
        self.requests: collections.Counter[tuple[str, str, str, str]] = collections.Counter()

    @property
    def registry(self) -> Registry:
        return self.backend.objects.registry

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        user = authenticate(request.headers, self.backend.tokens, self.backend.objects.store)
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return json_response(discovery.VERSION_INFO)
        if path == "/metrics":
            return web.Response(text=self.metrics_text(), content_type="text/plain")
        if path == "/":
            return json_response(discovery.ROOT_PATHS)
        if parts[0] == "openapi":
            return self._openapi(parts)
        if parts[0] == "api":
            if len(parts) == 1:
                return json_response(discovery.api_versions(self.address))
            return await self._resource_request(request, user, "", parts[1], parts[2:])
        if parts[0] == "apis":
            if len(parts) == 1:
                return json_response(discovery.api_group_list(self.registry))
            if len(parts) == 2:
                versions = self.registry.groups().get(parts[1])
                if not versions:
                    raise ApiError(
                        404, "NotFound", f"the server could not find the requested resource: {path}"
                    )
                return json_response(
                    {"kind": "APIGroup", "apiVersion": "v1", **discovery.api_group(parts[1], versions)}
                )
            return await self._resource_request(request, user, parts[1], parts[2], parts[3:])
        raise ApiError(
            404, "NotFound", f"the server could not find the requested resource ({request.method} {path})"
        )

    def _openapi(self, parts: list[str]) -> web.Response:
        if parts[1:2] != ["v3"]:
            raise ApiError(404, "NotFound", "OpenAPI v2 is not served; use /openapi/v3")
        if len(parts) == 2:
            return json_response(openapi.index(self.registry))
        rest = parts[2:]
        group, version = (
            ("", rest[1])
            if rest[0] == "api" and len(rest) == 2
            else ((rest[1], rest[2]) if rest[0] == "apis" and len(rest) == 3 else (None, None))
        )
        if group is None or version not in self.registry.groups().get(group, []):
            raise ApiError(404, "NotFound", f"no OpenAPI document for /{'/'.join(rest)}")
        return json_response(openapi.gv_document(self.registry, group, version))

    def metrics_text(self) -> str:
        """apiserver_request_total in the Prometheus text format (the verb in upper case, as kube-apiserver)."""
        lines = ["# TYPE apiserver_request_total counter"]
        for (verb, group, resource, sub), n in sorted(self.requests.items()):
            labels = f'verb="{verb}",group="{group}",resource="{resource}",subresource="{sub}"'
            lines.append(f"apiserver_request_total{{{labels}}} {n}")
        return "\n".join(lines) + "\n"

    def authorize(
        self, user: User | None, verb: str, group: str, resource: str, ns: str, name: str | None
    ) -> None:
        if user is None or rbac_allows(self.backend.objects.store, user, verb, group, resource, ns, name):
            return
        raise forbidden(
            forbidden_message(user, verb, group, resource, ns, name),
            {"name": name or "", "group": group, "kind": resource.partition("/")[0]},
        )

    async def _resource_request(
        self, request: web.Request, user: User | None, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        if not rest:
            if version not in self.registry.groups().get(group, []):
                raise path_not_found(request)
            return json_response(discovery.resource_list(self.registry, group, version))
        watch = truthy(request.query.get("watch"))
        if rest[0] == "watch":  # the deprecated /watch/ path prefix
            watch, rest = True, rest[1:]
        ns = ""
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise path_not_found(request)
        plural, name, sub = (
            rest[0],
            (rest[1] if len(rest) > 1 else None),
            (rest[2] if len(rest) > 2 else None),
        )
        if group == "" and plural == "bindings" and name is None and request.method == "POST":
            self.authorize(user, "create", "", "bindings", ns, None)
            body = await read_body(request)
            return json_response(
                pods.bind(self.backend.objects, ns, body.get("metadata", {}).get("name", ""), body), 201
            )
        rt = self.registry.get(group, version, plural)
        if rt is None:
            raise path_not_found(request)
        if rt.namespaced != bool(ns) and name is not None or (not rt.namespaced and ns):
            raise path_not_found(request)
        method = request.method
        if method == "GET":
            verb = "watch" if watch else ("get" if name else "list")
        elif method == "DELETE":
            verb = "delete" if name else "deletecollection"
        else:
            verb = _VERB_OF_METHOD.get(method, method.lower())
        self.requests[(verb.upper(), group, plural, sub or "")] += 1
        self.authorize(user, verb, group, plural + (f"/{sub}" if sub else ""), ns, name)
        if group == "authorization.k8s.io" and method == "POST" and name is None:
            review = access_review(
                self.backend.objects.store, rt.plural, rt.kind, user, await read_body(request)
            )
            return json_response(review, 201)
        call = Call(request, self.backend, user, rt, version, ns, name, watch)
        if sub is not None:
            return await serve_subresource(call, sub)
        if name is None:
            handler = COLLECTION.get(method)
            if handler is None:
                raise method_not_allowed(f"{method} is not supported on the collection {rt.qualified()}")
            return await handler(call)
        handler = OBJECT.get(method)
        if handler is None:
            raise method_not_allowed(f"{method} is not supported on {rt.qualified()}")
        return await handler(call)
