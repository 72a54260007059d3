"""The operator's Kubernetes client layer: one official `kubernetes.aio` client, created at startup.

Objects travel as plain Kubernetes JSON (camelCase dicts), the shape the planner reads and render.py writes, so
requests go through the client's generic `param_serialize`/`call_api` (auth, TLS, kubeconfig and in-cluster config
handled by the library) instead of the typed models, which would re-shape the manifests.

API errors become kopf's retry vocabulary: `kopf.TemporaryError` for what retrying fixes (409 conflicts, 429,
5xx, timeouts, connection errors), `kopf.PermanentError` for what needs a change first (400, 403, 422, ...).
A create answered 409 AlreadyExists is done, and a delete answered 404 is done.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.config.config_exception import ConfigException

from . import api

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 15.0
RETRY_DELAY_SECONDS = 2.0
KOPF_PEERING_GROUP = "kopf.dev"
KOPF_PEERING_VERSION = "v1"

# Where each kind the planner creates lives (path under the API root, namespaced).
_COLLECTIONS = {
    "Pod": "/api/v1/namespaces/{namespace}/pods",
    "Service": "/api/v1/namespaces/{namespace}/services",
    "Secret": "/api/v1/namespaces/{namespace}/secrets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
    api.KIND: f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{{namespace}}/{api.PLURAL}",
}


class ApiFailure(Exception):
    """An HTTP error answer, before it is classified as temporary or permanent."""

    def __init__(self, what: str, status: int, reason: str, message: str, retry_after: float | None = None):
        super().__init__(f"{what}: HTTP {status} {reason}: {message}")
        self.status, self.reason, self.message, self.retry_after = status, reason, message, retry_after


def classify(exc: ApiFailure) -> kopf.TemporaryError | kopf.PermanentError:
    """kopf's retry semantics for an API error answer."""
    if exc.status == 409 or exc.status == 429 or exc.status >= 500:
        return kopf.TemporaryError(str(exc), delay=exc.retry_after or RETRY_DELAY_SECONDS)
    return kopf.PermanentError(str(exc))


@dataclass(frozen=True)
class Secret:
    exists: bool
    token: str = ""


class Kube:
    """The operator's client. `connect()` once at startup, `close()` at cleanup."""

    def __init__(self, api_client: k8s.ApiClient):
        self.api = api_client

    @classmethod
    async def connect(cls, kubeconfig: str | None) -> Kube:
        """Explicit kubeconfig, else $KUBECONFIG or ~/.kube/config, else the in-cluster service account."""
        cfg = k8s.Configuration()
        if kubeconfig:
            if not os.path.exists(kubeconfig):
                raise kopf.PermanentError(f"--kubeconfig {kubeconfig} does not exist; pass an existing file")
            await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                await k8s_config.load_kube_config(client_configuration=cfg)
            except (ConfigException, OSError):
                try:
                    k8s_config.load_incluster_config(client_configuration=cfg)
                except ConfigException as exc:
                    raise kopf.PermanentError(
                        "no Kubernetes configuration: pass --kubeconfig, set $KUBECONFIG, or run in a pod "
                        f"with a service account ({exc})"
                    ) from exc
        return cls(k8s.ApiClient(cfg))

    async def close(self) -> None:
        await self.api.close()

    async def connection_info(self) -> kopf.ConnectionInfo:
        """The same credentials for kopf's own watches (one configuration for the whole operator)."""
        cfg = self.api.configuration
        header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
        if inspect.isawaitable(header):
            header = await header
        scheme, token = None, None
        if header:
            parts = header.split(" ", 1)
            scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
        return kopf.ConnectionInfo(
            server=cfg.host,
            ca_path=cfg.ssl_ca_cert,
            insecure=not cfg.verify_ssl,
            username=cfg.username or None,
            password=cfg.password or None,
            scheme=scheme,
            token=token,
            certificate_path=cfg.cert_file,
            private_key_path=cfg.key_file,
        )

    # --- the one request path -------------------------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        what: str,
        *,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        """JSON in, JSON out. Raises ApiFailure for HTTP errors, kopf.TemporaryError for transport failures."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        try:
            params = await self.api.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = await self.api.call_api(*params, _request_timeout=REQUEST_TIMEOUT_SECONDS)
            raw = await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise kopf.TemporaryError(
                f"{what}: {type(exc).__name__}: {exc}", delay=RETRY_DELAY_SECONDS
            ) from exc
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"message": raw[:200].decode(errors="replace")}
        if resp.status >= 400:
            retry_after = resp.getheader("Retry-After")
            raise ApiFailure(
                what,
                resp.status,
                str(doc.get("reason") or resp.reason or ""),
                str(doc.get("message") or ""),
                float(retry_after) if retry_after and retry_after.isdigit() else None,
            )
        return doc

    async def watch(
        self, path: str, query: list[tuple[str, Any]], timeout_seconds: int
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of a watch (`?watch=true` is added), parsed, until the server ends the stream. Raises
        ApiFailure for an HTTP error answer and kopf.TemporaryError for transport failures; an ERROR event (410
        Gone) is yielded like any other."""
        what = f"watch {path}"
        try:
            params = await self.api.param_serialize(
                method="GET",
                resource_path=path,
                query_params=[*query, ("watch", "true"), ("timeoutSeconds", timeout_seconds)],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            # No total limit beyond the server's own end of the stream; a silent connection ends it sooner.
            timeout = aiohttp.ClientTimeout(total=timeout_seconds + 60, sock_connect=REQUEST_TIMEOUT_SECONDS)
            resp = await self.api.call_api(*params, _request_timeout=timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise kopf.TemporaryError(
                f"{what}: {type(exc).__name__}: {exc}", delay=RETRY_DELAY_SECONDS
            ) from exc
        try:
            if resp.status >= 400:
                raw = await resp.read()
                try:
                    doc = json.loads(raw)
                except ValueError:
                    doc = {"message": raw[:200].decode(errors="replace")}
                raise ApiFailure(
                    what, resp.status, str(doc.get("reason") or ""), str(doc.get("message") or "")
                )
            try:
                async for line in resp.response.content:
                    if line.strip():
                        yield json.loads(line)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                raise kopf.TemporaryError(
                    f"{what}: {type(exc).__name__}: {exc}", delay=RETRY_DELAY_SECONDS
                ) from exc
        finally:
            resp.response.release()

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return await self.request(method, path, what, **kwargs)
        except ApiFailure as exc:
            raise classify(exc) from exc

    async def _get_or_none(self, path: str, what: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path, what)
        except ApiFailure as exc:
            if exc.status == 404:
                return None
            raise classify(exc) from exc

    # --- reads ----------------------------------------------------------------------------------------------------
    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = _COLLECTIONS[api.KIND].format(namespace=namespace) + f"/{name}"
        return await self._get_or_none(path, f"get TrainingJob {namespace}/{name}")

    async def list_pages(
        self, path: str, selector: str, limit: int = 500
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """A list in pages of `limit`: (items, the resourceVersion of the list) per page."""
        query: list[tuple[str, Any]] = [("labelSelector", selector), ("limit", limit)]
        while True:
            doc = await self._call("GET", path, f"list {path} {selector}", query=query)
            meta = doc.get("metadata") or {}
            yield list(doc.get("items") or []), str(meta.get("resourceVersion") or "")
            if not meta.get("continue"):
                return
            query = [("labelSelector", selector), ("limit", limit), ("continue", meta["continue"])]

    async def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = _COLLECTIONS["Service"].format(namespace=namespace) + f"/{name}"
        return await self._get_or_none(path, f"get Service {namespace}/{name}")

    async def get_secret(self, namespace: str, name: str, key: str) -> Secret:
        path = _COLLECTIONS["Secret"].format(namespace=namespace) + f"/{name}"
        doc = await self._get_or_none(path, f"get Secret {namespace}/{name}")
        if doc is None:
            return Secret(exists=False)
        # The API server turns stringData into data on write; a read never carries stringData.
        encoded = (doc.get("data") or {}).get(key)
        return Secret(True, base64.b64decode(encoded).decode() if encoded else "")

    # --- writes ---------------------------------------------------------------------------------------------------
    async def create(self, namespace: str, manifest: dict[str, Any]) -> bool:
        """True when created, False when it already existed (a re-issued create)."""
        return await self.create_object(namespace, manifest) is not None

    async def create_object(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """The created object as the API server answered it, or None when it already existed."""
        kind = manifest.get("kind", "")
        if kind not in _COLLECTIONS:
            raise kopf.PermanentError(
                f"the operator cannot create a {kind!r}; known kinds: {sorted(_COLLECTIONS)}"
            )
        name = (manifest.get("metadata") or {}).get("name")
        what = f"create {kind} {namespace}/{name}"
        try:
            return await self.request(
                "POST", _COLLECTIONS[kind].format(namespace=namespace), what, body=manifest
            )
        except ApiFailure as exc:
            if exc.status == 409 and exc.reason == "AlreadyExists":
                return None
            raise classify(exc) from exc

    async def delete(
        self,
        namespace: str,
        kind: str,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        propagation: str = "Background",
        uid: str | None = None,
    ) -> bool:
        """True when the delete was accepted, False when the object was already gone (or, with `uid`, when the
        name now belongs to another object: the API server's precondition makes that a 409 Conflict)."""
        if kind not in _COLLECTIONS:
            raise kopf.PermanentError(
                f"the operator cannot delete a {kind!r}; known kinds: {sorted(_COLLECTIONS)}"
            )
        query: list[tuple[str, Any]] = [("propagationPolicy", propagation)]
        if grace_period_seconds is not None:
            query.append(("gracePeriodSeconds", grace_period_seconds))
        path = _COLLECTIONS[kind].format(namespace=namespace) + f"/{name}"
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}} if uid else None
        try:
            await self.request("DELETE", path, f"delete {kind} {namespace}/{name}", query=query, body=body)
            return True
        except ApiFailure as exc:
            if exc.status == 404 or (uid and exc.status == 409):
                return False
            raise classify(exc) from exc

    async def patch_job_status(
        self, namespace: str, name: str, status_patch: dict[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch of the status subresource (planner.status_patch makes it)."""
        path = _COLLECTIONS[api.KIND].format(namespace=namespace) + f"/{name}/status"
        return await self._call(
            "PATCH",
            path,
            f"patch TrainingJob {namespace}/{name} status",
            body={"status": status_patch},
            content_type="application/merge-patch+json",
        )

    async def ensure_peering(self, name: str, namespaces: list[str]) -> None:
        """kopf peering needs its (Cluster)KopfPeering object; create it when missing."""
        if namespaces:
            targets = [
                (
                    f"/apis/{KOPF_PEERING_GROUP}/{KOPF_PEERING_VERSION}/namespaces/{ns}/kopfpeerings",
                    "KopfPeering",
                    ns,
                )
                for ns in namespaces
            ]
        else:
            targets = [
                (
                    f"/apis/{KOPF_PEERING_GROUP}/{KOPF_PEERING_VERSION}/clusterkopfpeerings",
                    "ClusterKopfPeering",
                    None,
                )
            ]
        for path, kind, ns in targets:
            body = {
                "apiVersion": f"{KOPF_PEERING_GROUP}/{KOPF_PEERING_VERSION}",
                "kind": kind,
                "metadata": {"name": name, **({"namespace": ns} if ns else {})},
            }
            try:
                await self.request("POST", path, f"create {kind} {name}", body=body)
                log.info("created %s %s for peering", kind, name)
            except ApiFailure as exc:
                if exc.status == 409:
                    continue
                if exc.status == 404:
                    raise kopf.PermanentError(
                        f"--peering {name}: the {kind} resource is not served; install kopf's peering CRDs "
                        "(the chart does with peering.createCRDs=true) or run without --peering"
                    ) from exc
                raise classify(exc) from exc
