"""Stopping together: signal flags, the per-step agreement, the coordinator poller and the termination message.

Signal handlers only record that a signal came (and when); the training loop does the rest at a step boundary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ftjob_trainer import contract

log = logging.getLogger(__name__)

NO_DEFICIT = -1e18  # "my save fits" (or I was not signalled): the MAX over ranks ignores it


class StopSignals:
    """Installs handlers that only set a flag. `received` is the signal's name, `at` its time.monotonic(),
    `wall_at` its time.time() (for the stop_signal event, which the loop emits: a handler only assigns floats)."""

    def __init__(self, names: list[str]):
        self.received: str | None = None
        self.at: float | None = None
        self.wall_at: float | None = None
        self._previous = {}
        for name in names:
            sig = getattr(signal, name)
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.at, self.wall_at = time.monotonic(), time.time()
            self.received = signal.Signals(signum).name  # last: whoever sees it set sees the times too

    def restore(self) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)


@dataclass
class Agreement:
    stop: bool  # some rank was signalled (the coordinator only requests checkpoints; it cannot ask to stop)
    request_id: int  # newest coordinator checkpoint request rank 0 has seen (0: none)
    deficit: float  # max over ranks of (estimated save time - time left before the deadline); > 0: cannot fit
    fenced: bool = False  # some rank learned that a newer world exists (fence.py): stop, save nothing


def agree(stop: bool, request_id: int, deficit: float, fenced: bool = False) -> Agreement:
    """One tiny all-reduce (MAX) per step; a CPU tensor, so on GPU it runs on gloo without a device sync."""
    t = torch.tensor(
        [1.0 if stop else 0.0, float(request_id), deficit, 1.0 if fenced else 0.0], dtype=torch.float64
    )
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return Agreement(bool(t[0] > 0), int(t[1]), float(t[2]), bool(t[3] > 0))


FINAL_FLUSH_SECONDS = 1.0  # close(): the most it spends on the last progress post


class CoordinatorClient:
    """Rank 0 only. A daemon thread polls GET /v1/progress (for checkpoint requests) and posts the newest
    progress; the training loop never waits on the network."""

    def __init__(self, url: str, token: str | None, interval: float, fence: Any = None):
        self.url, self.token, self.interval = url.rstrip("/"), token, interval
        # a fence.Fence: posts carry its epoch; a 409 (a newer world exists) fences this one
        self.fence = fence
        self.latest_request = 0
        self.latest_reason: str | None = None  # the reason the coordinator gave for latest_request
        self._pending: dict | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_error = ""
        self._thread = threading.Thread(target=self._run, name="ftjob-coordinator-poll", daemon=True)
        self._thread.start()

    def _call(self, method: str, route: str, body: dict | None = None, timeout: float = 5.0) -> dict:
        req = urllib.request.Request(self.url + route, method=method)
        if self.token:
            req.add_header(contract.AUTH_HEADER, f"Bearer {self.token}")
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, data=data, timeout=timeout) as resp:
            return json.loads(resp.read() or b"{}")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._tick()
            self._stop.wait(self.interval)

    def _tick(self) -> None:
        try:
            with self._lock:
                body, self._pending = self._pending, None
            if body is not None:
                self._post_progress(body)
            doc = self._call("GET", contract.ROUTE_PROGRESS)
            req = doc.get("checkpointRequest") or {}
            rid = int(req.get("id") or 0)
            if rid > max(self.latest_request, int(doc.get("handledRequestId") or 0)):
                log.info("coordinator asks for a checkpoint (request %d: %s)", rid, req.get("reason"))
                self.latest_reason = req.get("reason")
                self.latest_request = rid
            self._last_error = ""
        except (OSError, ValueError) as e:
            msg = f"{type(e).__name__}: {e}"
            if msg != self._last_error:  # log each new kind of failure once, not every poll
                log.warning("coordinator %s unreachable (%s); training goes on", self.url, msg)
                self._last_error = msg
            if body is not None:
                with self._lock:
                    self._pending = body if self._pending is None else {**body, **self._pending}

    def _post_progress(self, body: dict, timeout: float = 5.0) -> None:
        if self.fence is not None and self.fence.epoch is not None:
            body = dict(body, worldEpoch=self.fence.epoch)
        try:
            self._call("POST", contract.ROUTE_PROGRESS, body, timeout)
        except urllib.error.HTTPError as e:
            if e.code != 409 or self.fence is None:
                raise
            try:
                doc = json.loads(e.read() or b"{}")
            except ValueError:
                doc = {}
            log.error("progress refused by the coordinator: %s", doc.get("error"))
            self.fence.refuse(doc.get("epoch"), "progress", doc.get("error") or "a newer world exists")

    def post_progress(self, **fields: Any) -> None:
        with self._lock:
            self._pending = {**(self._pending or {}), **fields}

    def close(self) -> None:
        """Stop polling and post the last progress (the stop step's lastCheckpoint), within about
        FINAL_FLUSH_SECONDS: after a stop save the operator leaves only max(2, grace//20) s before torchrun's
        SIGKILL, and the termination message carries the checkpoint anyway."""
        self._stop.set()
        self._thread.join(timeout=FINAL_FLUSH_SECONDS / 2)  # a poll in progress: usually milliseconds
        with self._lock:
            body, self._pending = self._pending, None
        if body is None:
            return
        try:
            self._post_progress(body, timeout=FINAL_FLUSH_SECONDS / 2)
        except (OSError, ValueError) as e:
            log.warning(
                "last progress not posted to the coordinator %s (%s: %s)", self.url, type(e).__name__, e
            )


ERROR_REPORT_TIMEOUT = 3.0  # seconds: a coordinator that does not answer must not delay the exit much


def report_error(
    url: str | None, token: str | None, rank: int, exit_code: int, message: str, step: int | None
) -> bool:
    """POST /v1/error: tell the coordinator (so the operator) that this rank stops on a real error. torchrun restarts
    the worker inside its pod, so the pod itself never fails. Best effort: never raises, never waits long."""
    if not url:
        return False
    body = {
        "pod": os.environ.get(contract.ENV_POD_NAME, ""),
        "rank": rank,
        "exitCode": exit_code,
        "message": message[-contract.ERROR_MESSAGE_MAX :],
        "step": step,
    }
    req = urllib.request.Request(
        url.rstrip("/") + contract.ROUTE_ERROR, data=json.dumps(body).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header(contract.AUTH_HEADER, f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=ERROR_REPORT_TIMEOUT) as resp:
            resp.read()
        return True
    except (OSError, ValueError) as e:  # HTTPError is an OSError
        log.warning("could not report the error to the coordinator %s (%s: %s)", url, type(e).__name__, e)
        return False


def write_termination_message(path: str, doc: dict) -> None:
    """Kubernetes shows this file's content as the container's termination message. Best effort: an
    unwritable path (no /dev/termination-log outside a pod) is logged, never fatal."""
    try:
        with open(path, "w") as f:
            json.dump(doc, f)
    except OSError as e:
        log.warning("could not write the termination message to %s (%s): %s", path, e, json.dumps(doc))


def atomic_write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # a full disk keeps no half-written copy
            os.unlink(tmp)
        raise
