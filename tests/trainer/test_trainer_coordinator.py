"""The coordinator's control API (token, progress, checkpoint requests) and a trainer answering a request."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
from ftjob_trainer import contract
from ftjob_trainer.contract import parse_time
from torch.distributed import TCPStore
from trainer_testlib import (
    TINY,
    finish,
    free_port,
    http,
    list_steps,
    log_of,
    read_json,
    report_step,
    start_coordinator,
    wait_for,
)

pytestmark = pytest.mark.slow
TOKEN = "s3cret"


def test_token_is_required_and_the_api_answers(procs):
    _, ports = start_coordinator(procs, TOKEN)
    base = f"http://127.0.0.1:{ports['controlPort']}"
    assert http("GET", base + "/healthz") == (200, "ok")  # probes carry no token
    for token in (None, "wrong", ""):
        code, doc = http("GET", base + "/v1/progress", token)
        assert code == 401 and "Bearer" in doc["error"]
        assert http("POST", base + "/v1/checkpoint", token, {"reason": "x"})[0] == 401
    code, doc = http("GET", base + "/v1/progress", TOKEN)
    assert (
        code == 200
        and doc["step"] is None
        and doc["checkpointRequest"] is None
        and doc["handledRequestId"] == 0
    )
    before_ms = time.time_ns() // 1_000_000
    code, first = http("POST", base + "/v1/checkpoint", TOKEN, {"reason": "before upgrade"})
    assert code == 200 and first["id"] >= before_ms  # ms since the epoch: above any earlier coordinator's ids
    code, second = http("POST", base + "/v1/checkpoint", TOKEN, {})
    assert code == 200 and second["id"] > first["id"]
    code, doc = http(
        "POST", base + "/v1/progress", TOKEN, {"step": 7, "loss": 2.5, "handledRequestId": first["id"]}
    )
    assert code == 200 and doc["step"] == 7
    assert doc["checkpointRequest"] == {"id": second["id"], "reason": "requested"}
    code, doc = http("POST", base + "/v1/progress", TOKEN, {"step": "seven"})
    assert code == 400 and "step" in doc["error"]
    code, doc = http("POST", base + "/v1/progress", TOKEN, {"stepp": 1})
    assert code == 400 and "unknown progress field" in doc["error"]
    dropped = {"step": 6, "kind": "periodic", "message": "full", "kept": None, "time": "2026-01-01T00:00:00Z"}
    code, doc = http("POST", base + "/v1/progress", TOKEN, {"checkpointFailure": dropped})
    assert code == 200 and doc["checkpointFailure"] == dropped and doc["step"] == 7
    code, doc = http("POST", base + "/v1/progress", TOKEN, {"checkpointFailure": {"step": 8}})
    assert code == 400 and "checkpointFailure needs" in doc["error"]
    assert http("GET", base + "/v1/nothing", TOKEN)[0] == 404
    # the rendezvous half: a TCPStore server any client can use
    client = TCPStore(
        "127.0.0.1", ports["storePort"], is_master=False, timeout=__import__("datetime").timedelta(seconds=10)
    )
    client.set("k", "v")
    assert client.get("k") == b"v"


def test_coordinator_without_token_refuses_to_start(procs):
    p = procs.start(
        [
            __import__("sys").executable,
            "-m",
            "ftjob_trainer.coordinator",
            "--store-port",
            "0",
            "--control-port",
            "0",
        ],
        name="notoken",
        env={"FTJOB_TOKEN": ""},
    )
    assert finish(p, 60) == 2 and "FTJOB_TOKEN" in log_of(p)


def test_checkpoint_request_saves_on_all_ranks_and_training_continues(procs, tmp_path):
    _, ports = start_coordinator(procs, TOKEN)
    base = f"http://127.0.0.1:{ports['controlPort']}"
    report, ckpt = tmp_path / "r.json", tmp_path / "ckpt"
    args = [
        *TINY,
        "--steps",
        "80",
        "--checkpoint-dir",
        str(ckpt),
        "--keep-last",
        "5",
        "--report",
        str(report),
        "--poll-interval",
        "0.1",
        "--progress-every",
        "1",
    ]
    p = procs.torchrun(
        args,
        name="train",
        env={
            "FTJOB_COORDINATOR_URL": base,
            "FTJOB_TOKEN": TOKEN,
            "FTJOB_TERMINATION_LOG": str(tmp_path / "term"),
        },
    )
    wait_for(lambda: report_step(report) >= 3, timeout=120, proc=p, what="step 3")
    code, req = http("POST", base + "/v1/checkpoint", TOKEN, {"reason": "test"})
    assert code == 200
    saved = wait_for(lambda: list_steps(ckpt), timeout=60, proc=p, what="the requested checkpoint")
    assert finish(p) == 0, log_of(p)[-3000:]  # a request saves and goes on; only signals stop
    doc = read_json(report)
    assert doc["step"] == 80 and doc["preemption_saves"] == 0
    assert saved[0] < 80 and list_steps(ckpt) == [saved[0], 80]  # the request's save and the final one
    code, progress = http("GET", base + "/v1/progress", TOKEN)
    assert progress["handledRequestId"] == req["id"] and progress["step"] == 80 and progress["worldSize"] == 2
    assert progress["lastCheckpoint"]["step"] == 80 and progress["loss"] == pytest.approx(doc["loss"])
    # What the operator's progress, ETA and goodput come from: the run, its first step, the last step's time.
    run = progress["run"]
    assert (progress["totalSteps"], run["resumedFromStep"], run["resumedStepTime"]) == (80, 0, None)
    started, first, last = (
        parse_time(t) for t in (run["startedAt"], run["firstStepTime"], progress["stepTime"])
    )
    assert started < first < last and progress["tokensPerSecond"] > 0


def test_two_coordinators_on_two_addresses_share_the_ports(procs):
    """The local cluster runs every pod as a process of one host: two jobs' coordinators each listen on their own
    pod IP with the same ports (torch's TCPStore alone would take *:<port> and the second would fail)."""
    store_port, control_port = free_port(), free_port()
    hosts = ["127.0.0.2", "127.0.0.3"]
    for i, host in enumerate(hosts):
        _, ports = start_coordinator(
            procs, f"token-{i}", f"coord-{i}", host=host, store_port=store_port, control_port=control_port
        )
        assert ports == {"host": host, "storePort": store_port, "controlPort": control_port}
    stores = [TCPStore(host, store_port, is_master=False, timeout=timedelta(seconds=10)) for host in hosts]
    stores[0].set("job", "a")
    stores[1].set("job", "b")
    assert [s.get("job") for s in stores] == [b"a", b"b"], "each address must reach its own store"
    for i, host in enumerate(hosts):
        code, doc = http("GET", f"http://{host}:{control_port}{contract.ROUTE_PROGRESS}", f"token-{i}")
        assert code == 200 and "step" in doc
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", store_port))  # nothing listens on the wildcard address
