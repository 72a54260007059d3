"""The job coordinator: the rendezvous store (a torch TCPStore server that outlives any worker) and a small HTTP
control API (contract.py: /healthz, /v1/progress, /v1/checkpoint, /v1/error, /v1/world, /v1/fence) with a bearer
token from FTJOB_TOKEN.

    FTJOB_TOKEN=... python -m ftjob_trainer.coordinator --host=$(POD_IP) --store-port=29400 --control-port=29401

With port 0 the OS picks a free port; the first stdout line is JSON with the ports actually bound.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ftjob_trainer import contract

log = logging.getLogger("ftjob.coordinator")


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


PROGRESS_FIELDS = {
    "step": int,
    "stepTime": str,
    "loss": float,
    "worldSize": int,
    "totalSteps": int,
    "tokensPerSecond": float,
    "run": dict,
    "lastCheckpoint": dict,
    "checkpointFailure": dict,
    "handledRequestId": int,
    "worldEpoch": int,  # the poster's world (ROUTE_WORLD): an older one than the newest is refused (409)
}
# POST /v1/error: field -> (type, required)
ERROR_FIELDS = {
    "pod": (str, True),
    "rank": (int, True),
    "exitCode": (int, True),
    "message": (str, True),
    "step": (int, False),
}
# POST /v1/world and /v1/fence: field -> (type, required)
WORLD_FIELDS = {"worldSize": (int, True), "pod": (str, False), "run": (str, False)}
FENCE_FIELDS = {"epoch": (int, True), "step": (int, False)}


def check_fields(body: dict, fields: dict, what: str) -> None:
    for key, (want, required) in fields.items():
        value = body.get(key)
        if value is None and not required:
            continue
        if not isinstance(value, want) or isinstance(value, bool):
            raise ValueError(f"{what} field {key!r} must be {want.__name__} (got {type(value).__name__})")
    unknown = set(body) - set(fields)
    if unknown:
        raise ValueError(f"unknown {what} fields {sorted(unknown)}; known: {sorted(fields)}")


class StaleWorld(Exception):
    """A world older than the newest one the coordinator handed out (or saw) may not commit or report."""

    def __init__(self, epoch: int, newest: int):
        super().__init__(f"world epoch {epoch} is fenced: a newer world (epoch {newest}) exists")
        self.epoch, self.newest = epoch, newest


class State:
    """Progress and checkpoint requests, in memory (the operator keeps what must survive in the job's status)."""

    def __init__(self, clock_ids: bool = False, world_epoch: int = 0) -> None:
        # clock_ids: checkpoint request ids are milliseconds since the epoch (like error ids), so a recreated
        # coordinator's requests stay above the ones a running trainer already handled (it ignores ids at or below
        # the newest it saw). The coordinator process always uses them; plain counting (1, 2, ...) is for an
        # in-process State that lives exactly as long as its one consumer.
        self.clock_ids = clock_ids
        self.lock = threading.Lock()
        self.progress: dict[str, Any] = {
            "step": None,
            "stepTime": None,
            "loss": None,
            "worldSize": None,
            "totalSteps": None,
            "tokensPerSecond": None,
            "run": None,
            "updatedAt": None,
            "lastCheckpoint": None,
            "checkpointFailure": None,
            "checkpointRequest": None,
            "handledRequestId": 0,
            "lastError": None,
            "errors": [],
            "worldEpoch": None,
        }
        self.next_id = 1
        self.last_error_id = 0
        # The newest world epoch handed out or presented (0: none yet). A recreated coordinator starts from the one
        # the operator last read from its predecessor (--min-world-epoch), so an older world is refused at once.
        self.world_epoch = world_epoch

    def update(self, body: dict) -> dict:
        for key, value in body.items():
            want = PROGRESS_FIELDS.get(key)
            if want is None:
                raise ValueError(f"unknown progress field {key!r}; known: {sorted(PROGRESS_FIELDS)}")
            ok = isinstance(value, want) or (want is float and isinstance(value, int)) or value is None
            if not ok or isinstance(value, bool):
                raise ValueError(
                    f"progress field {key!r} must be {want.__name__} (got {type(value).__name__})"
                )
            if key == "lastCheckpoint" and value is not None and not {"step", "path"} <= set(value):
                raise ValueError("lastCheckpoint needs at least step and path")
            if (
                key == "checkpointFailure"
                and value is not None
                and not {"step", "message", "kept"} <= set(value)
            ):
                raise ValueError("checkpointFailure needs at least step, message and kept")
        with self.lock:
            if body.get("worldEpoch") is not None:
                self._check_epoch(body["worldEpoch"])  # a stale world's progress is not applied
            if "handledRequestId" in body and body["handledRequestId"] is not None:
                body = dict(
                    body, handledRequestId=max(body["handledRequestId"], self.progress["handledRequestId"])
                )
            self.progress.update(body)
            self.progress["updatedAt"] = now_rfc3339()
            return dict(self.progress)

    def request_checkpoint(self, reason: str) -> int:
        with self.lock:
            rid = max(self.next_id, time.time_ns() // 1_000_000) if self.clock_ids else self.next_id
            self.next_id = rid + 1
            self.progress["checkpointRequest"] = {"id": rid, "reason": reason}
            return rid

    def new_world(self, body: dict) -> int:
        """A world formed: its epoch, above every epoch handed out or seen. Milliseconds since the epoch, bumped past
        the last one (like error ids), so a recreated coordinator's epochs stay above its predecessor's."""
        check_fields(body, WORLD_FIELDS, "world")
        with self.lock:
            self.world_epoch = max(self.world_epoch + 1, time.time_ns() // 1_000_000)
            self.progress["worldEpoch"] = self.world_epoch
            return self.world_epoch

    def fence(self, body: dict) -> int:
        """May the world `epoch` commit? Returns the newest epoch; raises StaleWorld when a newer world exists."""
        check_fields(body, FENCE_FIELDS, "fence")
        with self.lock:
            return self._check_epoch(body["epoch"])

    def _check_epoch(self, epoch: int) -> int:
        """Under the lock. A larger epoch than any known is adopted: a restarted coordinator learns the newest world
        from the first trainer that presents its epoch (a stale one, presenting later, has a smaller one)."""
        if epoch < self.world_epoch:
            raise StaleWorld(epoch, self.world_epoch)
        self.world_epoch = epoch
        self.progress["worldEpoch"] = epoch
        return epoch

    def report_error(self, body: dict) -> int:
        check_fields(body, ERROR_FIELDS, "error")
        with self.lock:
            # Milliseconds since the epoch: a recreated coordinator's ids stay above the ones the operator handled.
            self.last_error_id = max(self.last_error_id + 1, time.time_ns() // 1_000_000)
            doc = {**{k: body.get(k) for k in ERROR_FIELDS}, "id": self.last_error_id, "time": now_rfc3339()}
            doc["message"] = doc["message"][-contract.ERROR_MESSAGE_MAX :]
            self.progress["lastError"] = doc
            self.progress["errors"] = [*self.progress["errors"], doc][-contract.ERRORS_KEPT :]
            return doc["id"]

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.progress)


POST_ROUTES = (
    contract.ROUTE_PROGRESS,
    contract.ROUTE_CHECKPOINT,
    contract.ROUTE_ERROR,
    contract.ROUTE_WORLD,
    contract.ROUTE_FENCE,
)


def make_handler(state: State, token: str):
    class Handler(BaseHTTPRequestHandler):
        server_version = "ftjob-coordinator"

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, code: int, doc: Any) -> None:
            raw = (doc if isinstance(doc, str) else json.dumps(doc)).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(doc, str) else "application/json")
            self.send_header("Content-Length", str(len(raw)))
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="ftjob"')
            self.end_headers()
            self.wfile.write(raw)

        def _authorized(self) -> bool:
            got = self.headers.get(contract.AUTH_HEADER, "")
            if got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), token.encode()):
                return True
            self._send(
                401, {"error": "missing or wrong bearer token: send 'Authorization: Bearer <FTJOB_TOKEN>'"}
            )
            return False

        def _body(self) -> dict | None:
            try:
                n = int(self.headers.get("Content-Length") or 0)
                doc = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(doc, dict):
                    raise ValueError("the body must be a JSON object")
                return doc
            except ValueError as e:
                self._send(400, {"error": f"bad JSON body: {e}"})
                return None

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == contract.ROUTE_HEALTH:
                return self._send(200, "ok")
            if not self._authorized():
                return
            if self.path == contract.ROUTE_PROGRESS:
                return self._send(200, state.snapshot())
            self._send(404, {"error": f"no route GET {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            if self.path not in POST_ROUTES:
                return self._send(404, {"error": f"no route POST {self.path}"})
            body = self._body()
            if body is None:
                return
            try:
                if self.path == contract.ROUTE_PROGRESS:
                    return self._send(200, state.update(body))
                if self.path == contract.ROUTE_WORLD:
                    epoch = state.new_world(body)
                    log.info("world epoch %d: %s ranks (pod %s)", epoch, body["worldSize"], body.get("pod"))
                    return self._send(200, {"epoch": epoch})
                if self.path == contract.ROUTE_FENCE:
                    return self._send(200, {"epoch": state.fence(body)})
            except ValueError as e:
                return self._send(400, {"error": str(e)})
            except StaleWorld as e:
                log.warning("refused %s from world %d (step %s): %s", self.path, e.epoch, body.get("step"), e)
                return self._send(409, {"error": str(e), "epoch": e.newest})
            if self.path == contract.ROUTE_ERROR:
                try:
                    eid = state.report_error(body)
                except ValueError as e:
                    return self._send(400, {"error": str(e)})
                log.warning(
                    "error report %d from %s rank %s: %s", eid, body["pod"], body["rank"], body["message"]
                )
                return self._send(200, {"id": eid})
            reason = body.get("reason", "requested")
            if not isinstance(reason, str):
                return self._send(400, {"error": "reason must be a string"})
            rid = state.request_checkpoint(reason)
            log.info("checkpoint request %d: %s", rid, reason)
            self._send(200, {"id": rid})

    return Handler


class Coordinator:
    def __init__(self, host: str, store_port: int, control_port: int, token: str, world_epoch: int = 0):
        from torch.distributed import TCPStore  # imported here: the HTTP half needs no torch

        # TCPStore's server listens on every address of the machine whatever host it is given. Bind the socket to
        # `host` here and hand it over, so the store holds only the pod's address: on the local cluster all pods
        # share one network namespace and the Service proxy already listens on <clusterIP>:29400.
        self._listener: socket.socket | None = None
        listen_fd = None
        if host not in ("", "0.0.0.0", "::"):
            self._listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, store_port))
            self._listener.listen(512)
            store_port, listen_fd = self._listener.getsockname()[1], self._listener.fileno()
        # wait_for_workers=False: the store serves agents as they come and go; it belongs to no worker
        self.store = TCPStore(
            host, store_port, is_master=True, wait_for_workers=False, master_listen_fd=listen_fd
        )
        self.state = State(clock_ids=True, world_epoch=world_epoch)
        self.http = ThreadingHTTPServer((host, control_port), make_handler(self.state, token))
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, name="ftjob-control-api", daemon=True)

    @property
    def ports(self) -> dict:
        return {"storePort": self.store.port, "controlPort": self.http.server_address[1]}

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s coordinator %(levelname)s %(message)s")
    p = argparse.ArgumentParser(
        prog="python -m ftjob_trainer.coordinator", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--host", default="0.0.0.0", help="address to bind both servers to (the pod IP)")
    p.add_argument(
        "--store-port", type=int, default=contract.RDZV_PORT, help="TCPStore port (--rdzv-endpoint)"
    )
    p.add_argument("--control-port", type=int, default=contract.CONTROL_PORT, help="HTTP control API port")
    p.add_argument(
        "--min-world-epoch",
        type=int,
        default=0,
        help="the newest world epoch a predecessor reported (the operator passes it): older worlds are refused",
    )
    args = p.parse_args(argv)
    token = os.environ.get(contract.ENV_TOKEN, "")
    if not token:
        log.error(
            "set %s to the job's token (the operator mounts it from the Secret <job>-token)",
            contract.ENV_TOKEN,
        )
        return contract.EXIT_CONFIG_ERROR
    coord = Coordinator(args.host, args.store_port, args.control_port, token, args.min_world_epoch)
    coord.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"host": args.host, **coord.ports}), flush=True)
    log.info("serving rendezvous store on %d and control API on %d", *coord.ports.values())
    stop.wait()
    coord.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
