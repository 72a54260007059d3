"""The HTTP side: an aiohttp application that speaks the Kubernetes REST API over the Store (discovery, OpenAPI v3,
CRUD, watch, patch, subresources, tables) and enforces the object semantics (resourceVersion, generation,
graceful deletion, finalizers, garbage collection)."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import ipaddress
import json
import logging
import math
import os
import random
import re
import uuid
from typing import Any

import yaml
from aiohttp import web

from . import builtin_schemas, openapi, protobuf, tables
from .auth import Tokens, User, forbidden_message, rbac_allows, unauthorized
from .errors import (
    ApiError,
    FieldError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    invalid,
    method_not_allowed,
    not_found,
)
from .patch import json_patch, merge_patch, strategic_merge_patch
from .resources import Registry, ResourceType
from .schema import check_cel_rules, process_custom_resource
from .selectors import label_selector_from_dict, parse_field_selector, parse_label_selector
from .store import Event, Key, Store

log = logging.getLogger("ftjob.apiserver")

CRD_KEY: Key = ("apiextensions.k8s.io", "customresourcedefinitions")
NS_KEY: Key = ("", "namespaces")
POD_KEY: Key = ("", "pods")
SVC_KEY: Key = ("", "services")
SA_KEY: Key = ("", "serviceaccounts")
PDB_KEY: Key = ("policy", "poddisruptionbudgets")
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
CLUSTER_IP_NET = ipaddress.ip_network("127.96.0.0/16")
BOOKMARK_EVERY_S = 5.0
EVENT_TTL_S = 3600.0  # kube-apiserver --event-ttl default
HOUSEKEEPING_EVERY_S = 60.0
LOG_POLL_S = 0.2
VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-ftjob-local",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def now_iso(offset_s: float = 0.0) -> str:
    t = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=offset_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=_dumps(obj), status=status, content_type="application/json", headers=headers)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "yes")


def _spec_part(obj: dict[str, Any], with_status: bool) -> dict[str, Any]:
    """Everything generation tracks: all but metadata (and status where status is a subresource)."""
    skip = {"metadata", "status"} if with_status else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}


def _name_errors(rt: ResourceType, name: str) -> list[FieldError]:
    if (
        rt.group == "rbac.authorization.k8s.io"
        or rt.key == ("", "events")
        or rt.key == ("events.k8s.io", "events")
    ):
        if name in (".", "..") or "/" in name or "%" in name:
            return [FieldError("metadata.name", f"Invalid value: \"{name}\": may not contain '/' or '%'")]
        return []
    if rt.key in (NS_KEY,):
        regex, limit, what = _DNS1123_LABEL, 63, "a lowercase RFC 1123 label"
    elif rt.key == SVC_KEY:
        regex, limit, what = _DNS1035_LABEL, 63, "a DNS-1035 label"
    else:
        regex, limit, what = _DNS1123_SUBDOMAIN, 253, "a lowercase RFC 1123 subdomain"
    errs = []
    if len(name) > limit:
        errs.append(
            FieldError("metadata.name", f'Invalid value: "{name}": must be no more than {limit} characters')
        )
    if not regex.match(name):
        errs.append(
            FieldError(
                "metadata.name",
                f'Invalid value: "{name}": {what} must consist of lower case '
                "alphanumeric characters, '-'"
                + (" or '.'" if regex is _DNS1123_SUBDOMAIN else "")
                + ", and must start and end with an alphanumeric character "
                f"(regex used for validation is '{regex.pattern[1:-1]}')",
            )
        )
    return errs


class ApiServer:
    """All state and semantics; `app` is the aiohttp application that serves them."""

    def __init__(self, state_dir: str):
        self.state_dir = os.path.abspath(state_dir)
        self.store = Store(self.state_dir)
        self.registry = Registry()
        for crd in self.store.list(CRD_KEY):
            self.registry.add_crd(crd)
        for ns in INITIAL_NAMESPACES:
            if self.store.get(NS_KEY, "", ns) is None:
                self.create(self.registry.types[NS_KEY], "v1", "", {"metadata": {"name": ns}}, {})
        self.tokens = Tokens(self.state_dir)
        self.address = ""
        self.app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self.app.cleanup_ctx.append(self._housekeeping)

    async def _housekeeping(self, app: web.Application) -> Any:
        """Background duties of the real control plane that clients rely on: events expire after EVENT_TTL_S."""

        async def loop() -> None:
            while True:
                self.expire_events()
                await asyncio.sleep(HOUSEKEEPING_EVERY_S)

        task = asyncio.create_task(loop())
        yield
        task.cancel()

    def expire_events(self, now: dt.datetime | None = None) -> int:
        now = now or dt.datetime.now(dt.timezone.utc)
        expired = 0
        for key in (("", "events"), ("events.k8s.io", "events")):
            rt = self.registry.types[key]
            for ev in self.store.list(key):
                seen = tables.parse_time(
                    ev.get("lastTimestamp") or ev.get("eventTime") or ev["metadata"].get("creationTimestamp")
                )
                if seen is not None and (now - seen).total_seconds() > EVENT_TTL_S:
                    self.delete(rt, ev["metadata"].get("namespace", ""), ev["metadata"]["name"], {})
                    expired += 1
        return expired

    def logs_dir(self, ns: str, pod: str) -> str:
        """Where the kubelet writes container output: DIR/logs/<namespace>/<pod>/<container>.log."""
        return os.path.join(self.state_dir, "logs", ns, pod)

    # ---------------------------------------------------------------- HTTP plumbing
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            return _json(e.status(), e.code)
        except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as e:
            return _json(bad_request(f"the request body is not valid JSON/YAML: {e}").status(), 400)
        except web.HTTPException:
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:  # a bug: say so as a Status, keep serving
            log.exception("internal error on %s %s", request.method, request.path)
            return _json(
                ApiError(
                    500,
                    "InternalError",
                    f"an error on the server ({e!r}) has prevented the request from succeeding",
                ).status(),
                500,
            )

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return {}
        ctype = request.content_type
        if "protobuf" in ctype:
            return protobuf.decode(raw)
        if "yaml" in ctype:
            return yaml.safe_load(raw.decode())
        return json.loads(raw)

    def _user(self, request: web.Request) -> User | None:
        """Who asks: None is the local administrator (no credentials); see auth.py."""
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("bearer "):
            claims = self.tokens.verify(header[7:].strip())
            if claims is None:
                raise unauthorized()
            sa = self.store.get(SA_KEY, claims["ns"], claims["sa"])
            if sa is None or sa["metadata"]["uid"] != claims.get("uid"):
                raise unauthorized()
            if request.headers.get("Impersonate-User"):
                raise forbidden(
                    f'users "{request.headers["Impersonate-User"]}" is forbidden: ServiceAccounts '
                    "may not impersonate on the local API server"
                )
            return User.service_account(claims["ns"], claims["sa"])
        if request.headers.get("Impersonate-User"):
            return User.named(
                request.headers["Impersonate-User"], request.headers.getall("Impersonate-Group", [])
            )
        return None

    def authorize(
        self, user: User | None, verb: str, group: str, resource: str, ns: str, name: str | None
    ) -> None:
        if user is None or rbac_allows(self.store, user, verb, group, resource, ns, name):
            return
        raise forbidden(
            forbidden_message(user, verb, group, resource, ns, name),
            {"name": name or "", "group": group, "kind": resource.partition("/")[0]},
        )

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        user = self._user(request)
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return _json(VERSION_INFO)
        if path == "/":
            return _json({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/openapi/v3", "/version"]})
        if parts[0] == "openapi":
            return self._openapi(parts)
        if parts[0] == "api":
            if len(parts) == 1:
                return _json(
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": self.address}
                        ],
                    }
                )
            return await self._resource_request(request, user, "", parts[1], parts[2:])
        if parts[0] == "apis":
            if len(parts) == 1:
                return _json(
                    {
                        "kind": "APIGroupList",
                        "apiVersion": "v1",
                        "groups": [self._api_group(g, vs) for g, vs in self.registry.groups().items() if g],
                    }
                )
            if len(parts) == 2:
                versions = self.registry.groups().get(parts[1])
                if not versions:
                    raise ApiError(
                        404, "NotFound", f"the server could not find the requested resource: {path}"
                    )
                return _json({"kind": "APIGroup", "apiVersion": "v1", **self._api_group(parts[1], versions)})
            return await self._resource_request(request, user, parts[1], parts[2], parts[3:])
        raise ApiError(
            404, "NotFound", f"the server could not find the requested resource ({request.method} {path})"
        )

    def _openapi(self, parts: list[str]) -> web.Response:
        if parts[1:2] != ["v3"]:
            raise ApiError(404, "NotFound", "OpenAPI v2 is not served; use /openapi/v3")
        if len(parts) == 2:
            return _json(openapi.index(self.registry))
        rest = parts[2:]
        group, version = (
            ("", rest[1])
            if rest[0] == "api" and len(rest) == 2
            else ((rest[1], rest[2]) if rest[0] == "apis" and len(rest) == 3 else (None, None))
        )
        if group is None or version not in self.registry.groups().get(group, []):
            raise ApiError(404, "NotFound", f"no OpenAPI document for /{'/'.join(rest)}")
        return _json(openapi.gv_document(self.registry, group, version))

    @staticmethod
    def _api_group(group: str, versions: list[str]) -> dict[str, Any]:
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = []
        for rt in self.registry.in_group_version(group, version):
            verbs = _verbs(rt)
            entry: dict[str, Any] = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": verbs,
            }
            if rt.short_names:
                entry["shortNames"] = rt.short_names
            if rt.categories:
                entry["categories"] = rt.categories
            resources.append(entry)
            for sub in rt.served_subresources(version):
                sub_entry: dict[str, Any] = {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get", "patch", "update"],
                }
                if sub == "scale":
                    sub_entry.update(group="autoscaling", version="v1", kind="Scale")
                elif sub == "log":
                    sub_entry["verbs"] = ["get"]
                elif sub == "eviction":
                    sub_entry.update(group="policy", version="v1", kind="Eviction", verbs=["create"])
                elif sub == "binding":
                    sub_entry.update(kind="Binding", verbs=["create"])
                elif sub == "token":
                    sub_entry.update(
                        group="authentication.k8s.io", version="v1", kind="TokenRequest", verbs=["create"]
                    )
                resources.append(sub_entry)
        if group == "" and version == "v1":
            resources.append(
                {
                    "name": "bindings",
                    "singularName": "binding",
                    "namespaced": True,
                    "kind": "Binding",
                    "verbs": ["create"],
                }
            )
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    async def _resource_request(
        self, request: web.Request, user: User | None, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        if not rest:
            if version not in self.registry.groups().get(group, []):
                raise ApiError(
                    404, "NotFound", f"the server could not find the requested resource ({request.path})"
                )
            return _json(self._resource_list(group, version))
        params = request.query
        watch = _truthy(params.get("watch"))
        if rest[0] == "watch":  # the deprecated /watch/ path prefix
            watch, rest = True, rest[1:]
        ns = ""
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            ns, rest = rest[1], rest[2:]
        plural, name, sub = (
            rest[0],
            (rest[1] if len(rest) > 1 else None),
            (rest[2] if len(rest) > 2 else None),
        )
        if len(rest) > 3:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({request.path})"
            )
        if group == "" and plural == "bindings" and name is None and request.method == "POST":
            self.authorize(user, "create", "", "bindings", ns, None)
            body = await self._body(request)
            return _json(self.bind(ns, body.get("metadata", {}).get("name", ""), body), 201)
        rt = self.registry.get(group, version, plural)
        if rt is None:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({request.path})"
            )
        if rt.namespaced != bool(ns) and name is not None or (not rt.namespaced and ns):
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({request.path})"
            )
        method = request.method
        verb = {
            "GET": "watch" if watch else ("get" if name else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(method, method.lower())
        self.authorize(user, verb, group, plural + (f"/{sub}" if sub else ""), ns, name)
        if group == "authorization.k8s.io" and method == "POST" and name is None:
            return _json(self.access_review(rt, user, await self._body(request)), 201)
        if name is None:
            if method == "GET":
                if watch:
                    return await self.watch(request, rt, version, ns or None)
                return _json(self.list_response(request, rt, version, ns or None))
            if method == "POST":
                body = await self._body(request)
                obj = self.create(rt, version, ns, body, params)
                return _json(self.out(rt, version, obj), 201, self._warnings(obj))
            if method == "DELETE":
                body = await self._body(request)
                return _json(self.delete_collection(rt, version, ns or None, params, body))
            raise method_not_allowed(f"{method} is not supported on the collection {rt.qualified()}")
        if sub is None:
            if method == "GET":
                if watch:  # legacy watch of one object
                    return await self.watch(request, rt, version, ns or None, name)
                obj = self.out(rt, version, self.get(rt, ns, name))
                if "as=Table" in request.headers.get("Accept", ""):
                    return _json(
                        tables.to_table(
                            rt,
                            version,
                            [obj],
                            obj["metadata"]["resourceVersion"],
                            params.get("includeObject", "Metadata"),
                        )
                    )
                return _json(obj)
            if method == "PUT":
                body = await self._body(request)
                obj = self.update(rt, version, ns, name, body, params)
                return _json(self.out(rt, version, obj), 200, self._warnings(obj))
            if method == "PATCH":
                body = await self._body(request)
                obj, created = self.patch(rt, version, ns, name, body, request.content_type, params)
                return _json(self.out(rt, version, obj), 201 if created else 200, self._warnings(obj))
            if method == "DELETE":
                body = await self._body(request)
                obj = self.delete(rt, ns, name, self._delete_options(params, body))
                return _json(self.out(rt, version, obj))
            raise method_not_allowed(f"{method} is not supported on {rt.qualified()}")
        if rt.key == POD_KEY and sub in ("exec", "attach", "portforward", "proxy"):
            raise bad_request(
                f"pods/{sub} is not supported by the ftjob local cluster: a pod's containers are "
                f"processes on this machine (see `kubectl logs {name}`; their output is under "
                f"{self.logs_dir(ns, name)})"
            )
        if sub not in rt.served_subresources(version):
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({request.path})"
            )
        if sub == "log":
            if method != "GET":
                raise method_not_allowed("pods/log only supports GET")
            return await self.pod_log(request, ns, name)
        if sub == "token":
            if method != "POST":
                raise method_not_allowed("serviceaccounts/token only supports POST (create)")
            return _json(self.token_request(ns, name, await self._body(request)), 201)
        if sub == "eviction":
            if method != "POST":
                raise method_not_allowed("pods/eviction only supports POST (create)")
            return _json(self.evict(ns, name, await self._body(request)), 201)
        if sub == "binding":
            if method != "POST":
                raise method_not_allowed("pods/binding only supports POST (create)")
            return _json(self.bind(ns, name, await self._body(request)), 201)
        if sub == "status":
            if method == "GET":
                return _json(self.out(rt, version, self.get(rt, ns, name)))
            body = await self._body(request)
            if method == "PUT":
                return _json(
                    self.out(rt, version, self.update(rt, version, ns, name, body, params, "status"))
                )
            if method == "PATCH":
                obj, _ = self.patch(rt, version, ns, name, body, request.content_type, params, "status")
                return _json(self.out(rt, version, obj))
            raise method_not_allowed(f"{method} is not supported on {rt.plural}/status")
        if sub == "scale":
            if method == "GET":
                return _json(self.scale_of(rt, version, self.get(rt, ns, name)))
            body = await self._body(request)
            if method in ("PUT", "PATCH"):
                return _json(
                    self.set_scale(rt, version, ns, name, body, method, request.content_type, params)
                )
            raise method_not_allowed(f"{method} is not supported on {rt.plural}/scale")
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")

    def _warnings(self, obj: dict[str, Any]) -> dict[str, str] | None:
        warnings = obj.pop("__warnings__", None) if isinstance(obj, dict) else None
        if not warnings:
            return None
        return {"Warning": ", ".join(f"299 - {json.dumps(w)}" for w in warnings)}

    def out(self, rt: ResourceType, version: str, obj: dict[str, Any]) -> dict[str, Any]:
        """An object as served at `version`: custom resources are stored once and shown at the version asked for."""
        if rt.crd is not None or obj.get("apiVersion") != rt.api_version(version) or "kind" not in obj:
            obj = dict(obj)
            obj["apiVersion"] = rt.api_version(version)
            obj["kind"] = rt.kind
        obj.pop("__warnings__", None)
        return obj

    # ---------------------------------------------------------------- reads
    def get(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if obj is None:
            raise not_found(rt.plural, rt.group, name)
        return obj

    def matcher(self, params: Any, ns: str | None, name: str | None = None) -> Any:
        labels = parse_label_selector(params.get("labelSelector"))
        fields = parse_field_selector(params.get("fieldSelector"))

        def match(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            if ns is not None and meta.get("namespace", "") != ns:
                return False
            if name is not None and meta["name"] != name:
                return False
            return labels(meta.get("labels") or {}) and fields(obj)

        return match

    def list_response(
        self, request: web.Request, rt: ResourceType, version: str, ns: str | None
    ) -> dict[str, Any]:
        params = request.query
        match = self.matcher(params, ns)
        items = [o for o in self.store.list(rt.key, ns) if match(o)]
        rv = str(self.store.rv)
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
                _dumps({"ns": last.get("namespace", ""), "name": last["name"]}).encode()
            ).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        accept = request.headers.get("Accept", "")
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
            "items": [self.out(rt, version, o) for o in items],
        }

    async def watch(
        self, request: web.Request, rt: ResourceType, version: str, ns: str | None, name: str | None = None
    ) -> web.StreamResponse:
        params = request.query
        match = self.matcher(params, ns, name)
        as_table = "as=Table" in request.headers.get("Accept", "")
        include_object = params.get("includeObject", "Metadata")
        bookmarks = _truthy(params.get("allowWatchBookmarks"))
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        rv_param = params.get("resourceVersion") or ""
        send_initial = _truthy(params.get("sendInitialEvents"))
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self.store.watchers.add(queue)  # before reading history: nothing falls between the two
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
        )
        resp.enable_chunked_encoding()
        first = True

        def encode(etype: str, obj: dict[str, Any]) -> bytes:
            nonlocal first
            shown = self.out(rt, version, obj)
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
            return (_dumps({"type": etype, "object": shown}) + "\n").encode()

        def convert(ev: Event) -> tuple[str, dict[str, Any]] | None:
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

        try:
            await resp.prepare(request)
            last_rv = self.store.rv
            if rv_param in ("", "0") or send_initial:
                for obj in self.store.list(rt.key, ns):
                    if match(obj):
                        await resp.write(encode("ADDED", obj))
                if send_initial:
                    await resp.write(
                        encode("BOOKMARK", self._bookmark(rt, version, last_rv, initial_end=True))
                    )
            else:
                try:
                    since = int(rv_param)
                except ValueError as e:
                    raise bad_request(f"invalid resourceVersion {rv_param!r}: it must be a number") from e
                events = self.store.events_since(since, rt.key)
                if events is None:
                    gone = ApiError(
                        410, "Expired", f"too old resource version: {since} ({self.store.history_start})"
                    )
                    await resp.write((_dumps({"type": "ERROR", "object": gone.status()}) + "\n").encode())
                    return resp
                for ev in events:
                    out = convert(ev)
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
                            await resp.write(encode("BOOKMARK", self._bookmark(rt, version, self.store.rv)))
                    continue
                if ev.key != rt.key or ev.rv <= last_rv:
                    continue
                out = convert(ev)
                if out:
                    await resp.write(encode(*out))
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self.store.watchers.discard(queue)
        return resp

    def _bookmark(self, rt: ResourceType, version: str, rv: int, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": rt.kind, "apiVersion": rt.api_version(version), "metadata": meta}

    # ---------------------------------------------------------------- writes
    def _check_namespace(self, rt: ResourceType, ns: str, creating: bool) -> None:
        if not rt.namespaced:
            return
        nso = self.store.get(NS_KEY, "", ns)
        if nso is None:
            raise not_found("namespaces", "", ns)
        if creating and nso["metadata"].get("deletionTimestamp"):
            raise forbidden(
                f'{rt.plural} "{ns}" is forbidden: unable to create new content in namespace {ns} '
                "because it is being terminated",
                {
                    "name": ns,
                    "kind": rt.plural,
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {ns} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )

    def _check_kind(self, rt: ResourceType, version: str, body: dict[str, Any]) -> None:
        if not isinstance(body, dict):
            raise bad_request(f"the body must be a JSON object (a {rt.kind})")
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if kind and kind != rt.kind:
            raise bad_request(
                f"the kind of the body ({kind}) does not match the resource of the URL "
                f"({rt.qualified()}, kind {rt.kind})"
            )
        if api_version and api_version not in [rt.api_version(v) for v in rt.versions]:
            raise bad_request(
                f"the apiVersion of the body ({api_version}) does not match the URL "
                f"({rt.api_version(version)})"
            )

    def create(self, rt: ResourceType, version: str, ns: str, body: Any, params: Any) -> dict[str, Any]:
        self._check_kind(rt, version, body)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request(
                    f"the namespace of the provided object ({meta['namespace']}) does not match the "
                    f"namespace sent on the request ({ns})"
                )
            meta["namespace"] = ns
            self._check_namespace(rt, ns, creating=True)
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if meta.get("generateName"):
                for _ in range(10):
                    meta["name"] = meta["generateName"] + "".join(random.choices(_GENERATE_ALPHABET, k=5))
                    if self.store.get(rt.key, ns, meta["name"]) is None:
                        break
            else:
                raise invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [
                        FieldError(
                            "metadata.name",
                            "Required value: name or generateName is required",
                            "FieldValueRequired",
                        )
                    ],
                )
        name = meta["name"]
        obj["apiVersion"] = rt.api_version(version)
        obj["kind"] = rt.kind
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "selfLink"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso()
        meta["generation"] = 1
        if rt.has_status(version) and rt.key not in (("", "nodes"), POD_KEY, NS_KEY):
            obj.pop("status", None)
        errors = _name_errors(rt, name)
        try:
            self._admit(rt, version, obj, None, params)
        except ApiError as e:
            if e.reason != "Invalid" or not errors:
                raise
            errors += [FieldError(c["field"], c["message"], c["reason"]) for c in (e.details or {})["causes"]]
        if errors:
            raise invalid(rt.kind, rt.group, name, errors)
        if self.store.get(rt.key, ns if rt.namespaced else "", name) is not None:
            raise already_exists(rt.plural, rt.group, name)
        warnings = obj.pop("__warnings__", None)  # for the response only, never stored
        if _dry_run(params):
            meta["resourceVersion"] = str(self.store.rv)
        else:
            meta["resourceVersion"] = str(self.store.next_rv())
            self.store.put(rt.key, obj, None)
            self._after_write(rt, obj, None)
        return dict(obj, __warnings__=warnings) if warnings else obj

    def update(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        body: Any,
        params: Any,
        sub: str | None = None,
        precondition_required: bool = True,
    ) -> dict[str, Any]:
        self._check_kind(rt, version, body)
        old = self.get(rt, ns, name)
        meta = body.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != ns:
            raise bad_request(
                f"the namespace of the provided object ({meta['namespace']}) does not match the "
                f"namespace sent on the request ({ns})"
            )
        rv = meta.get("resourceVersion")
        if rv and str(rv) != old["metadata"]["resourceVersion"]:
            raise conflict(rt.plural, rt.group, name)
        if not rv and rt.crd is not None and precondition_required:
            raise invalid(
                rt.kind,
                rt.group,
                name,
                [
                    FieldError(
                        "metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update"
                    )
                ],
            )
        with_status = rt.has_status(version)
        if sub == "status":
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(body)
            new.setdefault("metadata", {})
            if with_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
        nmeta = new["metadata"]
        ometa = old["metadata"]
        for k in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "namespace",
            "name",
        ):
            if k in ometa:
                nmeta[k] = ometa[k]
            else:
                nmeta.pop(k, None)
        new["apiVersion"] = rt.api_version(version)
        new["kind"] = rt.kind
        if ometa.get("deletionTimestamp"):
            added = set(nmeta.get("finalizers") or []) - set(ometa.get("finalizers") or [])
            if added:
                raise forbidden(
                    f'{rt.plural} "{name}" is forbidden: no new finalizers can be added if the object '
                    f"is being deleted, found new finalizers {sorted(added)}"
                )
        if _spec_part(new, with_status) != _spec_part(old, with_status):
            nmeta["generation"] = int(ometa.get("generation", 1)) + 1
        self._admit(rt, version, new, old, params)
        nmeta["resourceVersion"] = ometa["resourceVersion"]
        new_warn = new.pop("__warnings__", None)
        if new == old:
            return old  # a no-op update changes nothing and wakes no watcher, as in Kubernetes
        if new_warn:
            new["__warnings__"] = new_warn
        if _dry_run(params):
            return new
        warnings = new.pop("__warnings__", None)
        nmeta["resourceVersion"] = str(self.store.next_rv())
        if (
            nmeta.get("deletionTimestamp")
            and not nmeta.get("finalizers")
            and not self._grace_pending(rt, new)
        ):
            self._remove(rt, new)
            return new
        self.store.put(rt.key, new, old)
        self._after_write(rt, new, old)
        if warnings:
            new = dict(new, __warnings__=warnings)
        return new

    def _grace_pending(self, rt: ResourceType, obj: dict[str, Any]) -> bool:
        """A pod whose grace period is running stays until the kubelet deletes it with grace 0."""
        return rt.key == POD_KEY and int(obj["metadata"].get("deletionGracePeriodSeconds") or 0) > 0

    def patch(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        body: Any,
        content_type: str,
        params: Any,
        sub: str | None = None,
    ) -> tuple[dict[str, Any], bool]:
        old = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if content_type == "application/apply-patch+yaml":
            # Server-side apply, simplified: create when missing, else merge (no field ownership tracking).
            if old is None:
                body.setdefault("metadata", {})["name"] = name
                return self.create(rt, version, ns, body, params), True
            patched = merge_patch(old, body)
        else:
            if old is None:
                raise not_found(rt.plural, rt.group, name)
            current = self.out(rt, version, old)
            if content_type == "application/json-patch+json":
                patched = json_patch(current, body)
            elif content_type == "application/merge-patch+json":
                patched = merge_patch(current, body)
            elif content_type == "application/strategic-merge-patch+json":
                if rt.crd is not None:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - "
                        "accepted media types include: application/json-patch+json, "
                        "application/merge-patch+json, application/apply-patch+yaml",
                    )
                patched = strategic_merge_patch(current, body)
            else:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"unsupported patch type {content_type!r}: use "
                    "application/json-patch+json, application/merge-patch+json or "
                    "application/strategic-merge-patch+json",
                )
        if not isinstance(patched, dict):
            raise bad_request("the patch must leave an object")
        patched.setdefault("metadata", {})
        prv = patched["metadata"].get("resourceVersion")
        if prv and str(prv) != old["metadata"]["resourceVersion"]:
            raise conflict(rt.plural, rt.group, name)
        patched["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self.update(rt, version, ns, name, patched, params, sub), False

    # ---------------------------------------------------------------- admission (defaults + validation per type)
    def _admit(
        self, rt: ResourceType, version: str, obj: dict[str, Any], old: dict[str, Any] | None, params: Any
    ) -> None:
        name = obj["metadata"]["name"]
        meta = obj["metadata"]
        for field in ("labels", "annotations"):
            value = meta.get(field)
            if value is not None and (
                not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
            ):
                raise invalid(
                    rt.kind,
                    rt.group,
                    name,
                    [
                        FieldError(
                            f"metadata.{field}",
                            "Invalid value: must be a map of string keys to string values",
                        )
                    ],
                )
        meta_errors = _label_errors(meta.get("labels") or {})
        for i, ref in enumerate(meta.get("ownerReferences") or []):
            for f in ("apiVersion", "kind", "name", "uid"):
                if not isinstance(ref, dict) or not ref.get(f):
                    meta_errors.append(
                        FieldError(
                            f"metadata.ownerReferences[{i}].{f}", "Required value", "FieldValueRequired"
                        )
                    )
        if meta_errors:
            raise invalid(rt.kind, rt.group, name, meta_errors)
        if rt.crd is not None:
            self._admit_custom(rt, version, obj, old, params)
            return
        mode = params.get("fieldValidation", "Warn") if hasattr(params, "get") else "Warn"
        if mode in ("Strict", "Warn"):
            unknown = builtin_schemas.unknown_fields(obj)
            if unknown and mode == "Strict":
                fields = ", ".join(f'unknown field "{u}"' for u in unknown)
                raise bad_request(
                    f'{rt.kind} in version "{rt.versions[0]}" cannot be handled as a {rt.kind}: '
                    f"strict decoding error: {fields}"
                )
            if unknown:
                obj["__warnings__"] = [f'unknown field "{u}"' for u in unknown]
        hook = getattr(self, "_admit_" + rt.plural, None)
        if hook is not None and (rt.group in ("", "apiextensions.k8s.io")):
            hook(rt, obj, old)

    def _admit_custom(
        self, rt: ResourceType, version: str, obj: dict[str, Any], old: dict[str, Any] | None, params: Any
    ) -> None:
        schema = (rt.crd_version(version).get("schema") or {}).get("openAPIV3Schema") or {}
        processed, unknown, errors = process_custom_resource(obj, old, schema)
        name = obj["metadata"]["name"]
        mode = params.get("fieldValidation", "Warn")
        if unknown and mode == "Strict":
            fields = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise bad_request(
                f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: '
                f"strict decoding error: {fields}"
            )
        if errors:
            raise invalid(rt.kind, rt.group, name, errors)
        obj.clear()
        obj.update(processed)
        if unknown and mode == "Warn":
            obj["__warnings__"] = [f'unknown field "{u}"' for u in unknown]

    def _admit_pods(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        spec = obj.setdefault("spec", {})
        errors = []
        containers = spec.get("containers")
        if not isinstance(containers, list) or not containers:
            errors.append(FieldError("spec.containers", "Required value", "FieldValueRequired"))
        for kind in ("initContainers", "containers"):
            for i, c in enumerate(spec.get(kind) or []):
                if not isinstance(c, dict) or not c.get("name"):
                    errors.append(
                        FieldError(f"spec.{kind}[{i}].name", "Required value", "FieldValueRequired")
                    )
                    continue
                if len(c["name"]) > 63 or not _DNS1123_LABEL.match(c["name"]):
                    errors.append(
                        FieldError(
                            f"spec.{kind}[{i}].name",
                            f'Invalid value: "{c["name"]}": a lowercase '
                            "RFC 1123 label of at most 63 characters",
                        )
                    )
                if not c.get("image"):
                    errors.append(
                        FieldError(f"spec.{kind}[{i}].image", "Required value", "FieldValueRequired")
                    )
                c.setdefault("terminationMessagePath", "/dev/termination-log")
                c.setdefault("terminationMessagePolicy", "File")
                c.setdefault(
                    "imagePullPolicy",
                    "Always"
                    if str(c.get("image", "")).endswith(":latest") or ":" not in str(c.get("image", ""))
                    else "IfNotPresent",
                )
                for p in c.get("ports") or []:
                    p.setdefault("protocol", "TCP")
        if (
            old is not None
            and (old.get("spec") or {}).get("nodeName")
            and spec.get("nodeName") != old["spec"]["nodeName"]
        ):
            errors.append(
                FieldError(
                    "spec.nodeName",
                    "Forbidden: pod updates may not change nodeName once set",
                    "FieldValueForbidden",
                )
            )
        elif old is not None and _pod_spec_fixed_part(spec) != _pod_spec_fixed_part(old.get("spec") or {}):
            # As in Kubernetes: what a real cluster refuses must fail here too, not only in production.
            errors.append(
                FieldError(
                    "spec",
                    "Forbidden: pod updates may not change fields other than "
                    "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                    "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
                    "tolerations), `spec.terminationGracePeriodSeconds`; delete and recreate the "
                    "pod instead",
                    "FieldValueForbidden",
                )
            )
        if errors:
            raise invalid(rt.kind, rt.group, obj["metadata"]["name"], errors)
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
        spec.setdefault("securityContext", {})
        spec.setdefault("enableServiceLinks", True)
        if old is None:
            obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}

    def _admit_services(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        errors = []
        for i, p in enumerate(spec.get("ports") or []):
            port = p.get("port")
            if not isinstance(port, int) or not 1 <= port <= 65535:
                errors.append(
                    FieldError(
                        f"spec.ports[{i}].port",
                        f"Invalid value: {port}: must be between 1 and 65535, inclusive",
                    )
                )
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", port)
        old_ip = (old or {}).get("spec", {}).get("clusterIP")
        if old_ip:
            if spec.get("clusterIP") and spec["clusterIP"] != old_ip:
                errors.append(
                    FieldError("spec.clusterIP", f'Invalid value: "{spec["clusterIP"]}": field is immutable')
                )
            spec["clusterIP"] = old_ip
        elif spec.get("clusterIP") and spec["clusterIP"] != "None":
            taken = {(s.get("spec") or {}).get("clusterIP") for s in self.store.list(SVC_KEY)}
            if spec["clusterIP"] in taken:
                errors.append(
                    FieldError(
                        "spec.clusterIP",
                        f'Invalid value: "{spec["clusterIP"]}": provided IP is already allocated',
                    )
                )
        elif not spec.get("clusterIP"):
            spec["clusterIP"] = self._allocate_cluster_ip()
        if errors:
            raise invalid(rt.kind, rt.group, obj["metadata"]["name"], errors)
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        obj.setdefault("status", {"loadBalancer": {}})

    def _allocate_cluster_ip(self) -> str:
        """A random free address, as Kubernetes allocates them: two local clusters running on one machine at the
        same time (parallel test runs) then rarely hand out the same address to services on the same port."""
        taken = {(s.get("spec") or {}).get("clusterIP") for s in self.store.list(SVC_KEY)}
        first = int(CLUSTER_IP_NET.network_address) + 1
        size = CLUSTER_IP_NET.num_addresses - 2
        start = random.randrange(size)
        for i in range(size):
            ip = str(ipaddress.ip_address(first + (start + i) % size))
            if ip not in taken:
                return ip
        raise ApiError(500, "InternalError", "the service IP range 127.96.0.0/16 is full")

    def _admit_namespaces(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        if old is None:
            obj["status"] = {"phase": "Active"}

    def _admit_secrets(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        obj.setdefault("type", "Opaque")
        annotations = obj["metadata"].get("annotations") or {}
        sa_name = annotations.get("kubernetes.io/service-account.name")
        if (
            obj["type"] == "kubernetes.io/service-account-token"
            and sa_name
            and not (obj.get("data") or {}).get("token")
        ):
            # The token controller's job in Kubernetes: fill in a token for the named ServiceAccount.
            ns = obj["metadata"]["namespace"]
            sa = self.store.get(SA_KEY, ns, sa_name)
            if sa is None:
                raise invalid(
                    "Secret",
                    "",
                    obj["metadata"]["name"],
                    [
                        FieldError(
                            "metadata.annotations[kubernetes.io/service-account.name]",
                            f'Invalid value: "{sa_name}": no ServiceAccount of that name in namespace {ns}; create it first',
                        )
                    ],
                )
            annotations["kubernetes.io/service-account.uid"] = sa["metadata"]["uid"]
            obj["metadata"]["annotations"] = annotations
            token = self.tokens.issue(ns, sa_name, sa["metadata"]["uid"])
            obj.setdefault("data", {}).update(
                {
                    "token": base64.b64encode(token.encode()).decode(),
                    "namespace": base64.b64encode(ns.encode()).decode(),
                }
            )
        data = obj.get("data") or {}
        for key, value in data.items():
            try:
                base64.b64decode(value, validate=True)
            except (ValueError, TypeError) as e:
                raise bad_request(
                    f'Secret in version "v1" cannot be handled as a Secret: data[{key}] is not '
                    "valid base64; put plain text under stringData instead"
                ) from e
        string_data = obj.pop("stringData", None) or {}
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        if data:
            obj["data"] = data

    def _admit_customresourcedefinitions(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        name = obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        errors: list[FieldError] = []
        names = spec.get("names") or {}
        group = spec.get("group") or ""
        if not group:
            errors.append(FieldError("spec.group", "Required value", "FieldValueRequired"))
        elif "." not in group:
            errors.append(
                FieldError(
                    "spec.group", f'Invalid value: "{group}": should be a domain with at least one dot'
                )
            )
        for f in ("plural", "kind"):
            if not names.get(f):
                errors.append(FieldError(f"spec.names.{f}", "Required value", "FieldValueRequired"))
        if names.get("plural") and group and name != f"{names['plural']}.{group}":
            errors.append(
                FieldError(
                    "metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'
                )
            )
        scope = spec.get("scope")
        if scope not in ("Namespaced", "Cluster"):
            errors.append(
                FieldError(
                    "spec.scope",
                    f'Unsupported value: "{scope}": supported values: "Cluster", "Namespaced"',
                    "FieldValueNotSupported",
                )
            )
        versions = spec.get("versions") or []
        if not versions:
            errors.append(
                FieldError(
                    "spec.versions", "Invalid value: must have exactly one version marked as storage version"
                )
            )
        elif sum(1 for v in versions if v.get("storage")) != 1:
            errors.append(
                FieldError(
                    "spec.versions", "Invalid value: must have exactly one version marked as storage version"
                )
            )
        for i, v in enumerate(versions):
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            if not isinstance(schema, dict):
                errors.append(
                    FieldError(
                        f"spec.versions[{i}].schema.openAPIV3Schema",
                        "Required value: schemas are required",
                        "FieldValueRequired",
                    )
                )
                continue
            if schema.get("type") != "object":
                errors.append(
                    FieldError(
                        f"spec.versions[{i}].schema.openAPIV3Schema.type",
                        "Required value: must be object at the root",
                        "FieldValueRequired",
                    )
                )
            errors += check_cel_rules(schema, f"spec.versions[{i}].schema.openAPIV3Schema")
            for j, col in enumerate(v.get("additionalPrinterColumns") or []):
                where = f"spec.versions[{i}].additionalPrinterColumns[{j}]"
                for f in ("name", "type", "jsonPath"):
                    if not col.get(f):
                        errors.append(FieldError(f"{where}.{f}", "Required value", "FieldValueRequired"))
                if col.get("type") and col["type"] not in ("integer", "number", "string", "boolean", "date"):
                    errors.append(
                        FieldError(
                            f"{where}.type",
                            f'Unsupported value: "{col["type"]}": supported '
                            'values: "boolean", "date", "integer", "number", "string"',
                            "FieldValueNotSupported",
                        )
                    )
                try:
                    if col.get("jsonPath"):
                        tables.parse_column_path(col["jsonPath"])
                except Exception as e:  # jsonpath-ng raises several parse error types
                    errors.append(FieldError(f"{where}.jsonPath", f'Invalid value: "{col["jsonPath"]}": {e}'))
            v.setdefault("served", True)
            v.setdefault("storage", False)
        if errors:
            raise invalid(rt.kind, rt.group, name, errors)
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
        spec.setdefault("conversion", {"strategy": "None"})
        now = now_iso()
        storage = next(v["name"] for v in versions if v.get("storage"))
        stored = list(((old or {}).get("status") or {}).get("storedVersions") or [])
        if storage not in stored:
            stored.append(storage)
        obj["status"] = {
            "acceptedNames": copy.deepcopy(names),
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": now,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": now,
                },
            ],
            "storedVersions": stored,
        }

    # ---------------------------------------------------------------- after-write hooks
    def _after_write(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if rt.key == CRD_KEY:
            self.registry.add_crd(obj)
        elif rt.key == NS_KEY and old is None:
            sa_rt = self.registry.types[SA_KEY]
            name = obj["metadata"]["name"]
            if self.store.get(SA_KEY, name, "default") is None:
                self.create(sa_rt, "v1", name, {"metadata": {"name": "default"}}, {})

    # ---------------------------------------------------------------- deletion, finalizers, garbage collection
    @staticmethod
    def _delete_options(params: Any, body: Any) -> dict[str, Any]:
        opts = dict(body) if isinstance(body, dict) else {}
        if params.get("gracePeriodSeconds") is not None:
            opts["gracePeriodSeconds"] = int(params["gracePeriodSeconds"])
        if params.get("propagationPolicy"):
            opts["propagationPolicy"] = params["propagationPolicy"]
        if params.get("orphanDependents") is not None:
            opts["orphanDependents"] = _truthy(params["orphanDependents"])
        if params.get("dryRun"):
            opts["dryRun"] = [params["dryRun"]]
        return opts

    def delete(self, rt: ResourceType, ns: str, name: str, opts: dict[str, Any]) -> dict[str, Any]:
        obj = self.get(rt, ns, name)
        meta = obj["metadata"]
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise conflict(
                rt.plural,
                rt.group,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta['uid']}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise conflict(
                rt.plural,
                rt.group,
                name,
                "Precondition failed: ResourceVersion in precondition: "
                f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        if opts.get("dryRun"):
            return obj
        policy = opts.get("propagationPolicy") or ("Orphan" if opts.get("orphanDependents") else "Background")
        if policy not in ("Background", "Foreground", "Orphan"):
            raise bad_request(f"invalid propagationPolicy {policy!r}: use Background, Foreground or Orphan")
        grace = 0
        if rt.key == POD_KEY:
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            grace = opts.get("gracePeriodSeconds")
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", 30))
            if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
                grace = 0  # nothing runs it (or it already ended): gone at once, as in Kubernetes
            grace = max(int(grace), 0)
        if policy == "Orphan":
            self._orphan_dependents(meta["uid"])
        new = copy.deepcopy(obj)
        nmeta = new["metadata"]
        finalizers = list(nmeta.get("finalizers") or [])
        if (
            policy == "Foreground"
            and self.store.by_owner(meta["uid"])
            and "foregroundDeletion" not in finalizers
        ):
            finalizers.append("foregroundDeletion")
            nmeta["finalizers"] = finalizers
        if rt.key == NS_KEY:
            return self._delete_namespace(rt, new)
        already = nmeta.get("deletionTimestamp")
        if already:
            current = int(nmeta.get("deletionGracePeriodSeconds") or 0)
            if rt.key == POD_KEY and grace < current:
                nmeta["deletionGracePeriodSeconds"] = grace
                nmeta["deletionTimestamp"] = now_iso(grace)
            elif new == obj:
                return obj
        else:
            nmeta["deletionTimestamp"] = now_iso(grace)
            nmeta["deletionGracePeriodSeconds"] = grace
        if not finalizers and grace == 0:
            nmeta["resourceVersion"] = str(self.store.next_rv())
            self._remove(rt, new)
            return new
        nmeta["resourceVersion"] = str(self.store.next_rv())
        self.store.put(rt.key, new, obj)
        if "foregroundDeletion" in finalizers:
            self._cascade(meta["uid"], "Foreground")
            self._maybe_finish_foreground(meta["uid"])
        return self.store.get(rt.key, ns if rt.namespaced else "", name) or new

    def _remove(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Remove for good (obj carries its final resourceVersion), then collect what depended on it."""
        self.store.remove(rt.key, obj)
        meta = obj["metadata"]
        if rt.key == CRD_KEY:
            custom = self.registry.types.get((obj["spec"]["group"], obj["spec"]["names"]["plural"]))
            if custom is not None and custom.crd is not None:
                for cr in self.store.list(custom.key):
                    final = copy.deepcopy(cr)
                    final["metadata"]["resourceVersion"] = str(self.store.next_rv())
                    self.store.remove(custom.key, final)
            self.registry.remove_crd(obj)
        self._cascade(meta["uid"], "Background")
        for ref in meta.get("ownerReferences") or []:
            self._maybe_finish_foreground(ref.get("uid", ""))
        ns = meta.get("namespace")
        if ns:
            self._maybe_finish_namespace(ns)

    def _cascade(self, owner_uid: str, policy: str) -> None:
        for key, dep in self.store.by_owner(owner_uid):
            dmeta = dep["metadata"]
            if dmeta.get("deletionTimestamp") and policy == "Background":
                continue
            owners_left = [
                r
                for r in dmeta.get("ownerReferences") or []
                if r.get("uid") != owner_uid and r.get("uid") in self.store.by_uid
            ]
            if owners_left:
                continue
            dep_rt = self.registry.types.get(key)
            if dep_rt is None:
                continue
            if dmeta.get("deletionTimestamp"):
                continue
            self.delete(dep_rt, dmeta.get("namespace", ""), dmeta["name"], {"propagationPolicy": policy})

    def _maybe_finish_foreground(self, owner_uid: str) -> None:
        loc = self.store.by_uid.get(owner_uid)
        if loc is None:
            return
        key, ns, name = loc
        owner = self.store.get(key, ns, name)
        if owner is None or "foregroundDeletion" not in (owner["metadata"].get("finalizers") or []):
            return
        if self.store.by_owner(owner_uid):
            return
        rt = self.registry.types[key]
        new = copy.deepcopy(owner)
        new["metadata"]["finalizers"] = [
            f for f in new["metadata"]["finalizers"] if f != "foregroundDeletion"
        ]
        if not new["metadata"]["finalizers"]:
            new["metadata"].pop("finalizers")
        new["metadata"]["resourceVersion"] = str(self.store.next_rv())
        if not new["metadata"].get("finalizers") and not self._grace_pending(rt, new):
            self._remove(rt, new)
        else:
            self.store.put(key, new, owner)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for key, dep in self.store.by_owner(owner_uid):
            new = copy.deepcopy(dep)
            refs = [r for r in new["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences")
            new["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.put(key, new, dep)

    def _delete_namespace(self, rt: ResourceType, new: dict[str, Any]) -> dict[str, Any]:
        name = new["metadata"]["name"]
        old = self.store.get(NS_KEY, "", name)
        if not new["metadata"].get("deletionTimestamp"):
            new["metadata"]["deletionTimestamp"] = now_iso()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new.setdefault("status", {})["phase"] = "Terminating"
            new["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.put(NS_KEY, new, old)
        for key, rtype in list(self.registry.types.items()):
            if not rtype.namespaced:
                continue
            for obj in self.store.list(key, name):
                if not obj["metadata"].get("deletionTimestamp"):
                    self.delete(rtype, name, obj["metadata"]["name"], {})
        self._maybe_finish_namespace(name)
        return self.store.get(NS_KEY, "", name) or new

    def _maybe_finish_namespace(self, ns: str) -> None:
        nso = self.store.get(NS_KEY, "", ns)
        if nso is None or not nso["metadata"].get("deletionTimestamp"):
            return
        for key, rtype in self.registry.types.items():
            if rtype.namespaced and self.store.list(key, ns):
                return
        if nso["metadata"].get("finalizers"):
            return
        final = copy.deepcopy(nso)
        final["metadata"]["resourceVersion"] = str(self.store.next_rv())
        self.store.remove(NS_KEY, final)

    def delete_collection(
        self, rt: ResourceType, version: str, ns: str | None, params: Any, body: Any
    ) -> dict[str, Any]:
        match = self.matcher(params, ns)
        opts = self._delete_options(params, body)
        deleted = []
        for obj in self.store.list(rt.key, ns):
            if match(obj):
                deleted.append(
                    self.out(
                        rt,
                        version,
                        self.delete(rt, obj["metadata"].get("namespace", ""), obj["metadata"]["name"], opts),
                    )
                )
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version(version),
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": deleted,
        }

    # ---------------------------------------------------------------- pod subresources
    def bind(self, ns: str, name: str, body: Any) -> dict[str, Any]:
        rt = self.registry.types[POD_KEY]
        pod = self.get(rt, ns, name)
        target = (body or {}).get("target") or {}
        node = target.get("name")
        if not node:
            raise invalid(
                "Binding", "", name, [FieldError("target.name", "Required value", "FieldValueRequired")]
            )
        if (pod.get("spec") or {}).get("nodeName"):
            raise conflict(
                "pods/binding",
                "",
                name,
                f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise conflict(
                "pods/binding", "", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node
        conds = [
            c
            for c in (new.setdefault("status", {}).get("conditions") or [])
            if c.get("type") != "PodScheduled"
        ]
        conds.append(
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_iso()}
        )
        new["status"]["conditions"] = conds
        new["metadata"]["resourceVersion"] = str(self.store.next_rv())
        self.store.put(POD_KEY, new, pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def evict(self, ns: str, name: str, body: Any) -> dict[str, Any]:
        rt = self.registry.types[POD_KEY]
        pod = self.get(rt, ns, name)
        if not pod["metadata"].get("deletionTimestamp") and _pod_ready(pod):
            for pdb in self.store.list(PDB_KEY, ns):
                select = label_selector_from_dict((pdb.get("spec") or {}).get("selector"))
                if not select(pod["metadata"].get("labels") or {}):
                    continue
                if not self._pdb_allows(pdb, ns, select):
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's "
                        f"disruption budget {pdb['metadata']['name']!r}.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": "The disruption budget "
                                    f"{pdb['metadata']['name']} does not allow more disruptions",
                                }
                            ]
                        },
                    )
        new = copy.deepcopy(pod)
        conds = [
            c
            for c in (new.setdefault("status", {}).get("conditions") or [])
            if c.get("type") != "DisruptionTarget"
        ]
        conds.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastProbeTime": None,
                "lastTransitionTime": now_iso(),
            }
        )
        new["status"]["conditions"] = conds
        new["metadata"]["resourceVersion"] = str(self.store.next_rv())
        self.store.put(POD_KEY, new, pod)
        self.delete(rt, ns, name, (body or {}).get("deleteOptions") or {})
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _pdb_allows(self, pdb: dict[str, Any], ns: str, select: Any) -> bool:
        pods = [p for p in self.store.list(POD_KEY, ns) if select(p["metadata"].get("labels") or {})]
        expected = len(pods)
        healthy = sum(1 for p in pods if _pod_ready(p) and not p["metadata"].get("deletionTimestamp"))
        spec = pdb.get("spec") or {}

        def resolve(value: Any, round_up: bool) -> int:
            if isinstance(value, str) and value.endswith("%"):
                f = int(value[:-1]) * expected / 100
                return math.ceil(f) if round_up else math.floor(f)
            return int(value)

        if "minAvailable" in spec:
            return healthy - 1 >= resolve(spec["minAvailable"], True)
        if "maxUnavailable" in spec:
            return (expected - healthy) + 1 <= resolve(spec["maxUnavailable"], True)
        return True

    async def pod_log(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        rt = self.registry.types[POD_KEY]
        pod = self.get(rt, ns, name)
        params = request.query
        names = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        names += [c["name"] for c in (pod.get("spec") or {}).get("initContainers") or []]
        container = params.get("container")
        if not container:
            if len(names) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
                )
            container = names[0]
        if container not in names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        suffix = ".previous.log" if _truthy(params.get("previous")) else ".log"
        path = os.path.join(self.logs_dir(ns, name), container + suffix)
        if not os.path.exists(path):
            if suffix == ".previous.log":
                raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
            raise bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        tail = int(params["tailLines"]) if params.get("tailLines") else None
        limit = int(params["limitBytes"]) if params.get("limitBytes") else None
        with open(path, "rb") as f:
            data = f.read()
            offset = f.tell()
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail:]) if tail > 0 else b""
        if limit is not None:
            data = data[:limit]
        if not _truthy(params.get("follow")):
            return web.Response(body=data, content_type="text/plain")
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            await resp.write(data)
            sent = len(data)
            while limit is None or sent < limit:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                if chunk:
                    if limit is not None:
                        chunk = chunk[: limit - sent]
                    await resp.write(chunk)
                    sent += len(chunk)
                    continue
                current = self.store.get(POD_KEY, ns, name)
                if (
                    current is None
                    or current["metadata"]["uid"] != pod["metadata"]["uid"]
                    or _container_done(current, container)
                ):
                    break
                if request.transport is None or request.transport.is_closing():
                    break
                await asyncio.sleep(LOG_POLL_S)  # following a file the kubelet appends to
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    # ---------------------------------------------------------------- authentication and authorization APIs
    def token_request(self, ns: str, name: str, body: Any) -> dict[str, Any]:
        sa = self.get(self.registry.types[SA_KEY], ns, name)
        expires = int(((body or {}).get("spec") or {}).get("expirationSeconds") or 3600)
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": None},
            "spec": {
                "audiences": ((body or {}).get("spec") or {}).get("audiences") or [],
                "expirationSeconds": expires,
            },
            "status": {
                "token": self.tokens.issue(ns, name, sa["metadata"]["uid"], expires),
                "expirationTimestamp": now_iso(expires),
            },
        }

    def access_review(self, rt: ResourceType, user: User | None, body: Any) -> dict[str, Any]:
        spec = (body or {}).get("spec") or {}
        if rt.plural == "subjectaccessreviews":
            user = User.named(spec.get("user", ""), spec.get("groups") or [])
        attrs = spec.get("resourceAttributes") or {}
        if attrs:
            resource = attrs.get("resource", "") + (
                f"/{attrs['subresource']}" if attrs.get("subresource") else ""
            )
            allowed = user is None or rbac_allows(
                self.store,
                user,
                attrs.get("verb", ""),
                attrs.get("group", ""),
                resource,
                attrs.get("namespace", ""),
                attrs.get("name") or None,
            )
        else:  # non-resource URLs (discovery, /version, /healthz) are open to every authenticated user
            allowed = True
        out = dict(body or {})
        out.update(apiVersion="authorization.k8s.io/v1", kind=rt.kind)
        out["status"] = {"allowed": allowed, **({"reason": "RBAC: allowed"} if allowed else {})}
        return out

    # ---------------------------------------------------------------- scale subresource
    def scale_of(self, rt: ResourceType, version: str, obj: dict[str, Any]) -> dict[str, Any]:
        spec = rt.scale_spec(version) or {}
        meta = obj["metadata"]
        scale: dict[str, Any] = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {},
            "status": {"replicas": 0},
        }
        replicas = _get_path(obj, spec.get("specReplicasPath", ".spec.replicas"))
        if replicas is not None:
            scale["spec"]["replicas"] = replicas
        status_replicas = _get_path(obj, spec.get("statusReplicasPath", ".status.replicas"))
        scale["status"]["replicas"] = status_replicas or 0
        if spec.get("labelSelectorPath"):
            selector = _get_path(obj, spec["labelSelectorPath"])
            if selector is not None:
                scale["status"]["selector"] = selector
        return scale

    def set_scale(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        body: Any,
        method: str,
        content_type: str,
        params: Any,
    ) -> dict[str, Any]:
        obj = self.get(rt, ns, name)
        current = self.scale_of(rt, version, obj)
        if method == "PUT":
            new_scale = body
        elif content_type == "application/json-patch+json":
            new_scale = json_patch(current, body)
        elif content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
        ):
            new_scale = merge_patch(current, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {content_type!r}")
        rv = (new_scale.get("metadata") or {}).get("resourceVersion")
        if rv and rv != obj["metadata"]["resourceVersion"]:
            raise conflict(rt.plural, rt.group, name)
        replicas = (new_scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise invalid(
                "Scale",
                "autoscaling",
                name,
                [FieldError("spec.replicas", f"Invalid value: {replicas}: must be a non-negative integer")],
            )
        new = self.out(rt, version, copy.deepcopy(obj))
        _set_path(new, (rt.scale_spec(version) or {}).get("specReplicasPath", ".spec.replicas"), replicas)
        updated = self.update(rt, version, ns, name, new, params)
        return self.scale_of(rt, version, updated)


def _verbs(rt: ResourceType) -> list[str]:
    if rt.group == "authorization.k8s.io":
        return ["create"]  # access reviews are answered, never stored
    return ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _dry_run(params: Any) -> bool:
    return bool(params.get("dryRun")) if hasattr(params, "get") else False


_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _label_errors(labels: dict[str, str]) -> list[FieldError]:
    """Label keys and values as Kubernetes validates them (a label that a real cluster refuses fails here too)."""
    errors = []
    for key, value in labels.items():
        prefix, _, label = key.rpartition("/")
        if (
            (prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)))
            or len(label) > 63
            or not _LABEL_NAME.match(label)
        ):
            errors.append(
                FieldError(
                    "metadata.labels",
                    f'Invalid value: "{key}": a label key is an optional DNS '
                    "subdomain prefix and '/' followed by a name of at most 63 alphanumeric "
                    "characters, '-', '_' or '.', starting and ending with an alphanumeric",
                )
            )
        if len(value) > 63:
            errors.append(
                FieldError("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters')
            )
        elif value and not _LABEL_NAME.match(value):
            errors.append(
                FieldError(
                    "metadata.labels",
                    f'Invalid value: "{value}": a valid label must be an empty '
                    "string or consist of alphanumeric characters, '-', '_' or '.', and must start "
                    "and end with an alphanumeric character",
                )
            )
    return errors


def _pod_spec_fixed_part(spec: dict[str, Any]) -> dict[str, Any]:
    """The part of a pod spec that may not change after creation (nodeName is set once, by binding)."""
    fixed = copy.deepcopy(spec)
    for kind in ("containers", "initContainers"):
        for c in fixed.get(kind) or []:
            if isinstance(c, dict):
                c.pop("image", None)
    for key in (
        "activeDeadlineSeconds",
        "tolerations",
        "terminationGracePeriodSeconds",
        "schedulingGates",
        "nodeName",
    ):
        fixed.pop(key, None)
    return fixed


def _qos_class(spec: dict[str, Any]) -> str:
    reqs = [
        ((c.get("resources") or {}).get("requests") or {}, (c.get("resources") or {}).get("limits") or {})
        for c in spec.get("containers") or []
    ]
    if not any(r or lim for r, lim in reqs):
        return "BestEffort"
    if all(lim.get("cpu") and lim.get("memory") and (not r or r == lim) for r, lim in reqs):
        return "Guaranteed"
    return "Burstable"


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _container_done(pod: dict[str, Any], container: str) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        if cs.get("name") == container and "terminated" in (cs.get("state") or {}):
            return True
    return False


def _get_path(obj: Any, path: str) -> Any:
    cur = obj
    for part in path.lstrip(".").split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.lstrip(".").split(".")
    cur = obj
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
