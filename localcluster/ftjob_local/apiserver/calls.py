"""One API call as the handlers see it (`Call`), and what they work on (`Backend`): the HTTP request, the resource
it addresses, who asks, and the server's objects."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .auth import Tokens, User
from .objects import Objects
from .resources import ResourceType
from .wire import read_body


@dataclass
class Backend:
    objects: Objects
    tokens: Tokens
    state_dir: str

    def logs_dir(self, ns: str, pod: str) -> str:
        """Where the kubelet writes container output: DIR/logs/<namespace>/<pod>/<container>.log."""
        return os.path.join(self.state_dir, "logs", ns, pod)


@dataclass
class Call:
    request: web.Request
    backend: Backend
    user: User | None
    rt: ResourceType
    version: str
    ns: str  # "" for cluster-scoped resources and for lists across namespaces
    name: str | None  # None for the collection
    watch: bool = False  # ?watch=true, or the deprecated /watch/ path prefix

    @property
    def objects(self) -> Objects:
        return self.backend.objects

    @property
    def params(self) -> Any:
        return self.request.query

    @property
    def method(self) -> str:
        return self.request.method

    async def body(self) -> Any:
        return await read_body(self.request)

    def named(self) -> str:
        """The object's name (handlers of one object and of subresources always have one)."""
        assert self.name is not None
        return self.name


Handler = Callable[[Call], Awaitable[web.StreamResponse]]
