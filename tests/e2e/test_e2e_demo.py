"""`ftjob demo`, the README's main command, end to end through the installed `ftjob` console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_lib import needs_operator
from ftjob_local.cluster import LocalCluster
from ftjob_local.timeline import MOMENTS

pytestmark = [pytest.mark.slow, needs_operator]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_ftjob_demo_recovers_from_a_preemption_and_plots_it(tmp_path):
    state, out = tmp_path / "state", tmp_path / "out"
    ftjob = Path(sys.executable).parent / "ftjob"
    proc = subprocess.run(
        [
            str(ftjob),
            "demo",
            "--state-dir",
            str(state),
            "--out",
            str(out),
            "--notice",
            "3",
            "--replace-after",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=480,
    )
    try:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    finally:
        LocalCluster(state).down(say=lambda *_: None)  # no-op when the demo tore down, as it must
    for text in (
        "preempting local-spot-",
        "timeline",
        "lost steps 0",
        "recovery to step",  # the breakdown table
        "SIGTERM -> first step after resume: ",
        "goodput 0.",
        "lost to preemptions: ",
        "local cluster stopped",
    ):
        assert text in proc.stdout, proc.stdout[-4000:]
    # It ends with the goodput and what the preemption cost (the cluster's teardown line after them).
    last = [line for line in proc.stdout.splitlines() if line.strip()][-3:]
    assert last[0].startswith("goodput 0.") and last[1].startswith("lost to preemptions: "), last
    png = (out / "demo.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    result = json.loads((out / "demo.json").read_text())
    assert result["phase"] == "Succeeded"
    assert result["preemptions"] >= 1 and result["failures"] == 0
    assert result["final_step"] == 100 and result["lost_steps"] == 0
    # What the operator reports: goodput in (0, 1), seconds lost to the preemption, none to failures; the trainer's
    # events agree on the lost time within the operator's view of it (it sees steps when it polls).
    assert 0 < result["goodput"] < 1 and result["lost_preemptions_s"] > 0 and result["lost_failures_s"] == 0
    assert result["lost_preemptions_steps"] == 0 and result["lost_s_events"] > 0
    assert abs(result["lost_preemptions_s"] - result["lost_s_events"]) <= 2, result
    assert result["resumes"] and result["notice_at"] is not None
    assert any("replacement worker" in what for _, what in result["timeline"]), result["timeline"]
    # The breakdown of the recovery, from the trainer's events: the survivor restarted in its pod, the replacement
    # pod joined; every moment is known, and each process's own moments come in order.
    resume = result["resumes"][0]
    assert sorted(p["role"] for p in resume["pods"]) == ["replacement", "survivor"], resume["pods"]
    for pod in resume["pods"]:
        m = pod["moments"]
        assert [name for name, _, _ in pod["breakdown"]] == list(MOMENTS) and None not in m.values(), pod
        own = [
            m[k]
            for k in ("process_started", "imported", "process_group_ready", "checkpoint_loaded", "first_step")
        ]
        assert m["signal"] <= m["stop_committed"] and own == sorted(own), pod
        assert pod["load_bytes"] > 0 and pod["load_gbps"] > 0, pod
    # Torn down: nothing of the cluster runs any more.
    status = LocalCluster(state).status()
    assert not any(c["running"] for c in status["components"].values()), status
