"""`ApiServer`: the server's state (the object store, the types, the token key) and the aiohttp application that
serves it; the package docstring lists the modules and their layers."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
from typing import Any

from aiohttp import web
from ftjob_trainer.contract import format_time, parse_time

from .auth import Tokens
from .calls import Backend
from .errors import ApiError
from .objects import Objects
from .resources import CRD_KEY, EVENT_KEYS, INDEXED_FIELDS, NODE_KEY, NS_KEY, Registry
from .routing import Router
from .store import Store
from .wire import errors_as_status, json_response

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
EVENT_TTL_S = 3600.0  # kube-apiserver --event-ttl default
HOUSEKEEPING_EVERY_S = 60.0
# The node lifecycle controller's first duty (kube-controller-manager --node-monitor-grace-period, -period).
NODE_MONITOR_GRACE_S = 40.0
NODE_MONITOR_EVERY_S = 5.0
NODE_STATUS_UNKNOWN = ("NodeStatusUnknown", "Kubelet stopped posting node status.")
MERGE_PATCH = "application/merge-patch+json"

log = logging.getLogger(__name__)


class ApiServer:
    """All state and semantics; `app` is the aiohttp application that serves them."""

    def __init__(self, state_dir: str):
        self.state_dir = os.path.abspath(state_dir)
        self.store = Store(self.state_dir, INDEXED_FIELDS)
        self.registry = Registry()
        for crd in self.store.list(CRD_KEY):
            self.registry.add_crd(crd)
        self.tokens = Tokens(self.state_dir)
        self.objects = Objects(self.store, self.registry, self.tokens)
        for ns in INITIAL_NAMESPACES:
            if self.store.get(NS_KEY, "", ns) is None:
                self.objects.create(self.registry.types[NS_KEY], "v1", "", {"metadata": {"name": ns}}, {})
        self.backend = Backend(self.objects, self.tokens, self.state_dir)
        self.router = Router(self.backend)
        self.app = web.Application(
            middlewares=[self._answer_once_durable, errors_as_status], client_max_size=64 * 1024 * 1024
        )
        self.app.router.add_route("*", "/{tail:.*}", self.router.dispatch)
        self.app.cleanup_ctx.append(self._housekeeping)
        # node -> (its last heartbeat, when this server first saw it)
        self._heartbeats: dict[str, tuple[str, dt.datetime]] = {}

    @web.middleware
    async def _answer_once_durable(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every answer leaves after the writes made so far are committed (store.py: what a crash can lose)."""
        response = await handler(request)
        try:
            await self.store.durable()
        except RuntimeError as e:
            return json_response(ApiError(500, "InternalError", str(e)).status(), 500)
        return response

    @property
    def address(self) -> str:
        """host:port the clients reach the server at (set once the socket is bound)."""
        return self.router.address

    @address.setter
    def address(self, value: str) -> None:
        self.router.address = value

    def logs_dir(self, ns: str, pod: str) -> str:
        """Where the kubelet writes container output: DIR/logs/<namespace>/<pod>/<container>.log."""
        return self.backend.logs_dir(ns, pod)

    async def _housekeeping(self, app: web.Application) -> Any:
        """Background duties of the real control plane that clients rely on: events expire after EVENT_TTL_S, and
        a node whose kubelet stopped posting status turns Ready=Unknown (mark_silent_nodes)."""

        async def loop() -> None:
            events_due = 0.0
            while True:
                try:
                    if time.monotonic() >= events_due:
                        self.expire_events()
                        events_due = time.monotonic() + HOUSEKEEPING_EVERY_S
                    self.mark_silent_nodes()
                except Exception:  # a bad object must not end housekeeping for good
                    log.exception("housekeeping failed")
                await asyncio.sleep(NODE_MONITOR_EVERY_S)

        task = asyncio.create_task(loop())
        yield
        task.cancel()

    def expire_events(self, now: dt.datetime | None = None) -> int:
        now = now or dt.datetime.now(dt.timezone.utc)
        expired = 0
        for key in EVENT_KEYS:
            rt = self.registry.types[key]
            for ev in self.store.list(key):
                seen = _parse_time_or_none(
                    ev.get("lastTimestamp") or ev.get("eventTime") or ev["metadata"].get("creationTimestamp")
                )
                if seen is not None and (now - seen).total_seconds() > EVENT_TTL_S:
                    self.objects.delete(rt, ev["metadata"].get("namespace", ""), ev["metadata"]["name"], {})
                    expired += 1
        return expired

    def mark_silent_nodes(self, now: dt.datetime | None = None) -> list[str]:
        """Nodes whose kubelet posted no new Ready heartbeat for NODE_MONITOR_GRACE_S get every condition Unknown
        (NodeStatusUnknown), as the node lifecycle controller does for a kubelet that stopped reporting (killed,
        or its node agent down); the kubelet's next heartbeat sets them again. As that controller, it times a
        heartbeat from when this server first saw it, not from the kubelet's clock: a server that was down itself
        marks nothing until a grace period after it is back. Nodes without heartbeats (created by hand) are left
        alone, and the controller's taints and evictions are not emulated. Returns the names marked."""
        now = now or dt.datetime.now(dt.timezone.utc)
        rt = self.registry.types[NODE_KEY]
        nodes = self.store.list(NODE_KEY)
        names = {n["metadata"]["name"] for n in nodes}
        self._heartbeats = {k: v for k, v in self._heartbeats.items() if k in names}
        marked = []
        for node in nodes:
            name = node["metadata"]["name"]
            conds = (node.get("status") or {}).get("conditions") or []
            ready = next((c for c in conds if c.get("type") == "Ready"), None)
            beat = (ready or {}).get("lastHeartbeatTime")
            if ready is None or ready.get("status") == "Unknown" or not beat:
                continue
            if self._heartbeats.get(name, (None,))[0] != beat:
                self._heartbeats[name] = (beat, now)
            if (now - self._heartbeats[name][1]).total_seconds() <= NODE_MONITOR_GRACE_S:
                continue
            reason, message = NODE_STATUS_UNKNOWN
            unknown = {
                "status": "Unknown",
                "reason": reason,
                "message": message,
                "lastTransitionTime": format_time(now),
            }
            conds = [c if c.get("status") == "Unknown" else {**c, **unknown} for c in conds]
            self.objects.patch(
                rt, "v1", "", name, {"status": {"conditions": conds}}, MERGE_PATCH, {}, sub="status"
            )
            marked.append(name)
        return marked


def _parse_time_or_none(value: str | None) -> dt.datetime | None:
    """A client may write any string into an event's time fields: such an event is kept, not a crash."""
    try:
        return parse_time(value)
    except ValueError:
        return None
