"""`python -m ftjob_local.apiserver` as a process: it announces its URL once ready and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow


def test_module_entry_point_serves_and_stops_on_sigterm(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftjob_local.apiserver", "--state-dir", str(state), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url_file = state / "apiserver.url"
        deadline = time.monotonic() + 30
        while not url_file.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the API server did not write apiserver.url within 30 s"
            time.sleep(0.05)
        url = url_file.read_text().strip()
        with urllib.request.urlopen(f"{url}/version", timeout=5) as resp:
            assert json.load(resp)["minor"] == "32"
        with urllib.request.urlopen(f"{url}/api/v1/namespaces/default", timeout=5) as resp:
            assert json.load(resp)["status"]["phase"] == "Active"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert f"listening on {url}" in proc.stdout.read()
        assert (state / "objects.sqlite").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
