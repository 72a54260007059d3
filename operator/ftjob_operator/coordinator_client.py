"""The operator's side of the coordinator's control API (contract.py): read progress, ask for a checkpoint.

One aiohttp session for the whole operator. The coordinator is reached through its Service's clusterIP, the same
address the workers use, so no cluster DNS is needed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from ftjob_trainer import contract

PROGRESS_TIMEOUT_SECONDS = 2.0
CHECKPOINT_TIMEOUT_SECONDS = 5.0


class CoordinatorError(Exception):
    """The coordinator did not answer as the contract says; the message names the URL and what came back."""


def control_url(cluster_ip: str) -> str:
    return f"http://{cluster_ip}:{contract.CONTROL_PORT}"


class CoordinatorClient:
    def __init__(self, session: aiohttp.ClientSession):
        self.session = session

    @classmethod
    def create(cls) -> CoordinatorClient:
        return cls(aiohttp.ClientSession())

    async def close(self) -> None:
        await self.session.close()

    async def _call(
        self, method: str, url: str, token: str, timeout: float, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        headers = {contract.AUTH_HEADER: f"Bearer {token}"}
        try:
            async with self.session.request(
                method, url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise CoordinatorError(f"{method} {url}: HTTP {resp.status}: {text[:200]}")
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise CoordinatorError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(doc, dict):
            raise CoordinatorError(f"{method} {url}: expected a JSON object, got {type(doc).__name__}")
        return doc

    async def progress(self, base_url: str, token: str) -> dict[str, Any]:
        """GET /v1/progress: step, lastCheckpoint, checkpointRequest, ..."""
        return await self._call("GET", base_url + contract.ROUTE_PROGRESS, token, PROGRESS_TIMEOUT_SECONDS)

    async def request_checkpoint(self, base_url: str, token: str, reason: str) -> int:
        """POST /v1/checkpoint {"reason"}: every rank saves at its next step. Returns the request id."""
        doc = await self._call(
            "POST",
            base_url + contract.ROUTE_CHECKPOINT,
            token,
            CHECKPOINT_TIMEOUT_SECONDS,
            {"reason": reason},
        )
        if not isinstance(doc.get("id"), int):
            raise CoordinatorError(f"POST {base_url}{contract.ROUTE_CHECKPOINT}: no request id in {doc}")
        return doc["id"]
