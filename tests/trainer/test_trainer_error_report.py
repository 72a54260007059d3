"""A trainer that stops on a real error tells the coordinator (POST /v1/error), and GET /v1/progress shows it.

torchrun restarts a crashed trainer inside its pod (its restart budget stays huge so exit 75 always restarts), so the
operator counts failures from these reports, not from the pod.
"""

from __future__ import annotations

import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from ftjob_trainer import contract
from ftjob_trainer.coordinator import State, make_handler
from ftjob_trainer.preemption import report_error
from trainer_testlib import REPO, TINY, finish, free_port, http, log_of, start_coordinator, wait_for

TOKEN = "s3cret"


@pytest.fixture
def control_api():
    """The coordinator's real HTTP half (no TCPStore) on a free port, in a thread."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(State(), TOKEN))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def progress(base: str) -> dict:
    code, doc = http("GET", base + contract.ROUTE_PROGRESS, TOKEN)
    assert code == 200, doc
    return doc


def test_reports_land_in_progress_oldest_first_with_increasing_ids(control_api, monkeypatch):
    assert progress(control_api)["lastError"] is None and progress(control_api)["errors"] == []
    monkeypatch.setenv(contract.ENV_POD_NAME, "job-worker-3")
    assert report_error(control_api, TOKEN, 1, 1, "RuntimeError: boom", 12)
    monkeypatch.setenv(contract.ENV_POD_NAME, "job-worker-4")
    assert report_error(control_api + "/", TOKEN, 0, 2, "configuration error: --lr", None)
    doc = progress(control_api)
    first, second = doc["errors"]
    assert {k: first[k] for k in ("pod", "rank", "exitCode", "message", "step")} == {
        "pod": "job-worker-3",
        "rank": 1,
        "exitCode": 1,
        "message": "RuntimeError: boom",
        "step": 12,
    }
    assert second["pod"] == "job-worker-4" and second["step"] is None and doc["lastError"] == second
    # milliseconds since the epoch: a recreated coordinator's ids stay above the ones the operator handled
    assert time.time() * 1000 - 60_000 < first["id"] < second["id"]
    assert first["time"].endswith("Z")


def test_only_the_newest_reports_are_kept_and_long_messages_keep_their_end(control_api):
    for i in range(contract.ERRORS_KEPT + 3):
        code, doc = http(
            "POST",
            control_api + contract.ROUTE_ERROR,
            TOKEN,
            {"pod": "p", "rank": i, "exitCode": 1, "message": "x" * 5000 + f"end {i}"},
        )
        assert code == 200 and isinstance(doc["id"], int)
    errors = progress(control_api)["errors"]
    assert [e["rank"] for e in errors] == list(range(3, contract.ERRORS_KEPT + 3))
    assert len(errors[-1]["message"]) == contract.ERROR_MESSAGE_MAX
    assert errors[-1]["message"].endswith(f"end {contract.ERRORS_KEPT + 2}")


@pytest.mark.parametrize(
    "body,fix",
    [
        ({"rank": 0, "exitCode": 1, "message": "m"}, "'pod' must be str"),
        ({"pod": "p", "rank": "0", "exitCode": 1, "message": "m"}, "'rank' must be int"),
        ({"pod": "p", "rank": 0, "exitCode": True, "message": "m"}, "'exitCode' must be int"),
        ({"pod": "p", "rank": 0, "exitCode": 1, "message": "m", "step": 1.5}, "'step' must be int"),
        ({"pod": "p", "rank": 0, "exitCode": 1, "message": "m", "stp": 1}, "unknown error fields ['stp']"),
    ],
)
def test_bad_reports_are_refused_saying_what_to_fix(control_api, body, fix):
    code, doc = http("POST", control_api + contract.ROUTE_ERROR, TOKEN, body)
    assert code == 400 and fix in doc["error"], doc
    assert progress(control_api)["errors"] == []


def test_reports_need_the_token(control_api, caplog):
    assert http("POST", control_api + contract.ROUTE_ERROR, "wrong", {})[0] == 401
    assert not report_error(control_api, "wrong", 0, 1, "boom", 3)  # refused: logged, never raised
    assert "could not report the error" in caplog.text and "401" in caplog.text
    assert progress(control_api)["errors"] == []


def test_an_unreachable_coordinator_never_delays_the_exit_much():
    t = time.monotonic()
    assert not report_error(f"http://127.0.0.1:{free_port()}", TOKEN, 0, 1, "boom", 3)
    assert not report_error(None, TOKEN, 0, 1, "boom", 3)  # no coordinator configured: nothing to do
    assert time.monotonic() - t < 5


def test_a_configuration_error_is_reported_before_the_trainer_exits(control_api, monkeypatch, tmp_path):
    from ftjob_trainer.train import main

    monkeypatch.setenv(contract.ENV_COORDINATOR_URL, control_api)
    monkeypatch.setenv(contract.ENV_TOKEN, TOKEN)
    monkeypatch.setenv(contract.ENV_POD_NAME, "job-worker-7")
    monkeypatch.setenv("RANK", "3")
    assert main(["--model", "no-such-model", "--steps", "1"]) == contract.EXIT_CONFIG_ERROR
    (err,) = progress(control_api)["errors"]
    assert (err["pod"], err["rank"], err["exitCode"], err["step"]) == ("job-worker-7", 3, 2, None)
    assert err["message"].startswith("configuration error:") and "no-such-model" in err["message"]


CRASHING_DATA = """\
import os
import torch

class Crashing(torch.utils.data.Dataset):
    # Rank 1 crashes once training reaches global sample 24 (step 7 of 4-sample batches); rank 0 never does.
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i >= 24 and os.environ.get("RANK") == "1":
            raise RuntimeError("crashed on purpose (trainer test)")
        return torch.randint(0, 64, (33,), generator=torch.Generator().manual_seed(i))

def make_data(seq_len, vocab_size, seed):
    return Crashing()
"""


@pytest.mark.slow
def test_the_rank_that_crashes_reports_first_with_pod_rank_step_and_message(procs, tmp_path):
    (tmp_path / "crashing_data.py").write_text(CRASHING_DATA)
    _, ports = start_coordinator(procs, TOKEN)
    base = f"http://127.0.0.1:{ports['controlPort']}"
    p = procs.torchrun(
        [
            *TINY,
            "--steps",
            "50",
            "--data-factory",
            "crashing_data:make_data",
            "--termination-log",
            str(tmp_path / "t.log"),
        ],
        name="crash",
        env={
            "PYTHONPATH": f"{tmp_path}:{REPO}:{REPO / 'trainer_image'}",
            contract.ENV_COORDINATOR_URL: base,
            contract.ENV_TOKEN: TOKEN,
            contract.ENV_POD_NAME: "job-worker-5",
        },
    )
    assert finish(p, 180) != 0, log_of(p)[-3000:]
    errors = wait_for(lambda: progress(base)["errors"], timeout=10, what="an error report")
    first = errors[0]
    assert (first["pod"], first["rank"], first["exitCode"]) == ("job-worker-5", 1, contract.EXIT_ERROR), (
        errors
    )
    assert first["message"] == "RuntimeError: crashed on purpose (trainer test)"
    assert first["step"] == 6  # samples 0..23 are steps 1..6: the seventh step crashed
    # rank 0 may report its broken collective too, but only after the root cause
    assert all(e["rank"] == 0 and e["id"] > first["id"] for e in errors[1:]), errors
