"""Run by torchrun in the worker pods of the e2e test's job B (tests/e2e/test_e2e_network_policy.py) in place of the
trainer: it tries to open job A's rendezvous port through A's Service and straight at A's coordinator pod IP, and its
own job's through its own Service, writes what each connection did to the root of its checkpoint volume
(netpolicy-probe.json), then runs the trainer as usual, so job B is an ordinary job that trains to the end."""

from __future__ import annotations

import json
import os
import runpy
import socket
import sys
from pathlib import Path

RDZV_PORT = 29400
WAIT_SECONDS = 5.0


def connect(host: str) -> str:
    """'refused' (no listener), 'closed' (accepted, then closed at once: a NetworkPolicy refusal on the local
    cluster) or 'open' (held open, the store waiting for a request)."""
    try:
        conn = socket.create_connection((host, RDZV_PORT), timeout=WAIT_SECONDS)
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return f"error: {e}"
    with conn:
        conn.settimeout(WAIT_SECONDS)
        try:
            return "closed" if conn.recv(1) == b"" else "open"
        except TimeoutError:
            return "open"
        except ConnectionResetError:
            return "closed"


def main() -> None:
    results = {
        "service_a": connect(os.environ["NP_PROBE_SERVICE"]),
        "pod_a": connect(os.environ["NP_PROBE_POD"]),
        "service_own": connect(os.environ["FTJOB_COORDINATOR_ADDR"]),
    }
    # FTJOB_CHECKPOINT_DIR is <volume>/<namespace>/<job>: the volume's root is two levels up.
    out = Path(os.environ["FTJOB_CHECKPOINT_DIR"]).parents[1] / "netpolicy-probe.json"
    out.write_text(json.dumps(results))
    sys.argv = ["ftjob_trainer.train"]
    runpy.run_module("ftjob_trainer.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
