"""bench/local_scale.py: a run of two small sizes reports each size and the growth between them (no timing
asserts: this proves the script), and a size over its time limit is recorded as such, never silently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import local_scale  # noqa: E402  (bench/ is no package)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_sizes_in_one_run_report_each_size_and_the_growth(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "local_scale.py"), "--sizes", "4,8", "--out", str(out), "--no-write"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    assert [r["jobs"] for r in result["runs"]] == [4, 8]
    for run in result["runs"]:
        assert run["status"] == "complete" and run["pods_created"] == run["pods_expected"] == 3 * run["jobs"]
        assert run["all_pods_s"] > 0 and run["latency_p50_s"] <= run["latency_p99_s"]
        assert {"apiserver", "operator", "others"} <= run["cpu_seconds"].keys() and run["peak_rss_mb"][
            "operator"
        ]
        # each job's pods are created once: the operator re-issued none (the cache holds what it just created)
        assert run["requests_per_job"]["CREATE pods"] == 3
    assert [(g["from"], g["to"]) for g in result["growth"]] == [(4, 8)]
    assert result["growth"][0]["exponent"] == result["growth_first_to_last"]["exponent"] is not None
    table = (out / "results.md").read_text()
    assert "| 4 (12) |" in table and "| 8 (24) |" in table and "Growth exponent" in table


def _run(jobs: int, all_pods_s: float | None, status: str = "complete") -> dict:
    over = status != "complete"
    return {
        "jobs": jobs,
        "status": status,
        "over_limit": over,
        "limit_s": 100.0,
        "pods_expected": 3 * jobs,
        "pods_created": 3 * jobs,
        "all_pods_s": all_pods_s,
        "latency_p50_s": 1.0,
        "latency_p99_s": 2.0,
        "peak_rss_mb": {"operator": 100.0},
        "cpu_seconds": {"apiserver": 1.0, "operator": 1.0, "others": 0.5, "bench client": 0.1},
        "cpu_ms_per_job": {"apiserver": 1.0, "operator": 1.0, "others": 0.5, "bench client": 0.1},
        "requests_per_job": {"CREATE pods": 3.0},
        "load_average_before": 0.5,
        "goal": None,
        "goal_met": None,
    }


def test_a_size_over_its_limit_is_recorded_as_such_with_a_lower_bound_on_the_growth():
    args = local_scale.parse_args(["--sizes", "100,200,400", "--timeout", "100"])
    runs = [
        _run(100, 10.0),
        _run(200, 20.0),
        _run(400, None, "over its limit (100 s): 150/400 jobs had their pods"),
    ]
    result = local_scale.summarize(args, runs)
    assert result["growth"][0]["exponent"] == 1.0
    # 400 jobs took more than the 100 s limit: the exponent from 200 jobs (20 s) is at least log(5) / log(2)
    assert result["growth"][1] == {"from": 200, "to": 400, "exponent": None, "at_least": 2.322}
    assert result["growth_first_to_last"]["at_least"] == 1.661 and not result["goal_met"]
    table = local_scale.markdown(result)
    assert "over its limit (100 s): 150/400 jobs had their pods" in table
    assert "200 -> 400: > 2.322 (over its limit)" in table and "Goals NOT met." in table
