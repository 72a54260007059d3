"""The trainer's coordinator client at exit: the last progress is posted, and close() never takes much longer than
FINAL_FLUSH_SECONDS even when the coordinator does not answer (the operator leaves max(2, grace//20) s between the
save deadline and torchrun's SIGKILL)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ftjob_trainer import contract
from ftjob_trainer.preemption import FINAL_FLUSH_SECONDS, CoordinatorClient


class _Progress(BaseHTTPRequestHandler):
    posted: list = []

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._answer({"checkpointRequest": None, "handledRequestId": 0})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posted.append((self.path, body))
        self._answer(body)

    def _answer(self, doc):
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_close_posts_the_last_progress():
    _Progress.posted = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Progress)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        client = CoordinatorClient(f"http://127.0.0.1:{server.server_port}", None, interval=60)
        client.post_progress(step=5, lastCheckpoint={"step": 5, "path": "/c/step-000000005", "time": "t"})
        client.close()
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)
    assert (
        contract.ROUTE_PROGRESS,
        {"step": 5, "lastCheckpoint": {"step": 5, "path": "/c/step-000000005", "time": "t"}},
    ) in _Progress.posted


def test_close_is_bounded_when_the_coordinator_does_not_answer():
    # a listening socket nobody accepts from: connections succeed, requests never get an answer
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        client = CoordinatorClient(f"http://127.0.0.1:{sock.getsockname()[1]}", None, interval=60)
        client.post_progress(step=9)
        t = time.monotonic()
        client.close()
        took = time.monotonic() - t
    finally:
        sock.close()
    assert took < FINAL_FLUSH_SECONDS + 0.5, f"close() took {took:.2f}s"


def test_a_recreated_coordinators_request_ids_stay_above_the_old_ones():
    from ftjob_trainer.coordinator import State
    from ftjob_trainer.preemption import agree

    old = State(clock_ids=True)
    handled = [old.request_checkpoint("a"), old.request_checkpoint("b")]
    assert handled[1] > handled[0]
    # a recreation takes seconds, far more than the ms the ids can run ahead of the clock; wait for the clock
    # to pass the last id so the test is as strict as that
    deadline = time.monotonic() + 5
    while time.time_ns() // 1_000_000 <= max(handled) and time.monotonic() < deadline:
        time.sleep(0.001)
    new = State(clock_ids=True)  # the coordinator pod was recreated: nothing of the old state survives
    rid = new.request_checkpoint("after the restart")
    assert rid > max(handled), "the trainer ignores request ids at or below the newest it handled"
    assert agree(False, rid, 0.0).request_id == rid  # the id survives the float64 all-reduce exactly
