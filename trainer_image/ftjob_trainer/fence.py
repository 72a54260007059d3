"""Fencing a stale world (issue 10): only the newest world of a job may commit checkpoints or report progress.

Under CPU starvation c10d's rendezvous can drop an agent as dead while its worker keeps training, and a new round
forms without it: two worlds then train from the same checkpoint into the same folder. The coordinator hands every
world an epoch when its process group forms (contract.ROUTE_WORLD, before anything is loaded, so a newer world
loads whatever the older one committed before it was fenced). Rank 0 asks the coordinator before every commit
(contract.ROUTE_FENCE); a refused world commits nothing more, deletes nothing in the shared folder (the newer world
owns it: the next start removes what the refused save left) and stops at its next step with exit 75 (its agent
re-rendezvous; no error report, so the operator counts no failure).

No coordinator (standalone runs, tests, benches): no fence. A coordinator that does not answer when a world forms
leaves that world unfenced (it cannot know its epoch); one that does not answer at a commit lets the commit go on,
with a warning: it is down only briefly (the operator recreates it), and refusing every commit meanwhile would lose
work. A newer world is then caught at the next commit the coordinator answers, or by the 409 on progress posts.
The check and the commit are two steps: a world formed between them is caught at the stale world's next check.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Any

import torch
import torch.distributed as dist

from ftjob_trainer import contract, events
from ftjob_trainer.progress import wire_time

log = logging.getLogger("ftjob.fence")
TIMEOUT = 3.0  # seconds per request: a commit waits this long at most for an answer (then goes on)
FORM_TRIES = 10  # a coordinator being recreated: try this often (0.5 s apart) before training unfenced


class Fenced(RuntimeError):
    """A newer world exists: this one may not commit."""


class Fence:
    """This world's epoch and whether it is fenced. `epoch` None: no fence (no coordinator, or it did not answer
    when the world formed). `fenced` says why this process must stop (rank 0's check, the progress poller's 409,
    or a peer's, learned through agree())."""

    def __init__(self, url: str | None, token: str | None, rank: int):
        self.url, self.token, self.rank = (url.rstrip("/") if url else None), token, rank
        self.epoch: int | None = None
        self.newest: int | None = None  # the coordinator's newest epoch, when it refused this one
        self.fenced: str | None = None
        self.where: str | None = None  # what found it: "commit", "progress", "error" or "peer"

    @property
    def active(self) -> bool:
        return self.epoch is not None

    def _post(self, route: str, body: dict, timeout: float = TIMEOUT) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + route, data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header(contract.AUTH_HEADER, f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                doc = json.loads(e.read() or b"{}")
            except ValueError:
                doc = {}
            return e.code, doc if isinstance(doc, dict) else {}

    def form(self, world_size: int) -> None:
        """Collective (every rank, right after the process group formed): rank 0 takes a new epoch from the
        coordinator and every rank learns it. Without a coordinator URL this does nothing (identical on all ranks)."""
        if not self.url:
            return
        epoch = self._take_epoch(world_size) if self.rank == 0 else 0
        t = torch.tensor([epoch], dtype=torch.int64)
        if dist.is_initialized():
            dist.broadcast(t, src=0)
        self.epoch = int(t[0]) or None
        if self.epoch is not None:
            log.info("world epoch %d (%d ranks)", self.epoch, world_size)

    def _take_epoch(self, world_size: int) -> int:
        body = {
            "worldSize": world_size,
            "pod": os.environ.get(contract.ENV_POD_NAME),
            "run": wire_time(events.STARTED_AT),
        }
        why = ""
        for attempt in range(FORM_TRIES):
            try:
                code, doc = self._post(contract.ROUTE_WORLD, body)
                if code == 200 and isinstance(doc.get("epoch"), int):
                    return doc["epoch"]
                why = f"HTTP {code}: {doc.get('error')}"
                if code < 500:
                    break  # an answer that will not change (an older coordinator without the route, a wrong token)
            except (OSError, ValueError) as e:
                why = f"{type(e).__name__}: {e}"
            if attempt + 1 < FORM_TRIES:
                time.sleep(0.5)
        log.warning("no world epoch from the coordinator %s (%s): this world trains unfenced", self.url, why)
        return 0

    def allows_commit(self, step: int) -> bool:
        """Rank 0, right before a commit: is this world still the newest? A refusal marks this process fenced."""
        if not self.active or self.fenced:
            return not self.fenced
        try:
            code, doc = self._post(contract.ROUTE_FENCE, {"epoch": self.epoch, "step": step})
        except (OSError, ValueError) as e:
            log.warning(
                "coordinator %s did not answer the fence check of step %d (%s: %s); committing anyway",
                self.url,
                step,
                type(e).__name__,
                e,
            )
            return True
        if code == 409:
            self.refuse(doc.get("epoch"), "commit", doc.get("error") or "a newer world exists")
            log.error("checkpoint of step %d NOT committed: %s", step, self.fenced)
            return False
        if code != 200:
            log.warning("fence check of step %d answered HTTP %d (%s); committing anyway", step, code, doc)
        return True

    def stale_now(self) -> bool:
        """Any rank: ask the coordinator whether a newer world exists (on an error path: a stale world's errors,
        such as its folder removed by the newer world's start, are the fence's doing, not failures)."""
        if self.fenced:
            return True
        if not self.active:
            return False
        try:
            code, doc = self._post(contract.ROUTE_FENCE, {"epoch": self.epoch})
        except (OSError, ValueError):
            return False
        if code == 409:
            self.refuse(doc.get("epoch"), "error", doc.get("error") or "a newer world exists")
        return bool(self.fenced)

    def refuse(self, newest: Any, where: str, why: str) -> None:
        if not self.fenced:
            self.newest = newest if isinstance(newest, int) else None
            self.fenced, self.where = why, where

    def agree(self, pg: Any, refused: bool = False) -> tuple[bool, bool]:
        """Collective over pg (also the barrier it replaces): (was this save refused on any rank, is any rank
        fenced). Without a fence: a plain barrier, (refused, False)."""
        if not self.active:
            if pg is not None:
                dist.barrier(group=pg)
            return refused, False
        t = torch.tensor([1 if refused else 0, 1 if self.fenced else 0], dtype=torch.int64)
        if pg is not None:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg)
        if int(t[1]):
            self.refuse(None, "peer", "a peer rank's fence check was refused: a newer world exists")
        return bool(int(t[0])), bool(int(t[1]))

    def emit(self, step: int | None) -> str:
        """The fenced event; returns the exit message."""
        events.emit(contract.EVENT_FENCED, step=step, epoch=self.epoch, newest=self.newest, where=self.where)
        return f"stopped at step {step}, nothing more committed: {self.fenced}"
