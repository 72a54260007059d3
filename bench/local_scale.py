"""Operator scale on the local cluster: 500 TrainingJobs of 2 workers each, applied at once.

Each job runs a no-op trainer command and its pods ask for a node label no node has, so they stay Pending: the
benchmark measures the operator (watch, plan, create a Secret, a Service, a coordinator and 2 workers per job),
not 1,500 processes starting on 2 cores. Figures:

  all_pods_s        first create request -> the last of the 1,500 pods exists (goal < 60 s)
  latency p50/p99   a job's create request answered -> its 3 pods exist
  operator RSS      the operator process's peak resident memory (VmHWM; goal < 300 MB)

    .venv/bin/python bench/local_scale.py [--jobs 500] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ftjob_local.client import ApiError
from ftjob_local.session import GROUP_PATH
from local_common import local_cluster, machine, now_utc, write_section

GOAL_ALL_PODS_S = 60.0
GOAL_RSS_MB = 300.0
PODS_PER_JOB = 3  # coordinator + 2 workers
NOWHERE = {"ftjob.dev/bench": "no-such-node"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=500, help="TrainingJobs to apply (default 500)")
    p.add_argument("--clients", type=int, default=8, help="concurrent create requests (default 8)")
    p.add_argument("--timeout", type=float, default=300, help="give up after S seconds (default 300)")
    p.add_argument(
        "--state-dir", type=Path, default=None, help="cluster state folder (default: a temporary one)"
    )
    p.add_argument("--no-write", action="store_true", help="print JSON only; leave bench/RESULTS.md alone")
    args = p.parse_args(argv)
    if args.jobs < 1 or args.clients < 1:
        p.error("--jobs and --clients must be >= 1")
    return args


def job(name: str) -> dict:
    return {
        "apiVersion": "ftjob.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": "ftjob-trainer:dev",
            "command": ["-m", "this"],  # a no-op program for torchrun (it would print the Zen of Python)
            "workers": {"min": 2, "max": 2},
            "scheduling": {"workers": {"nodeSelector": NOWHERE}, "coordinator": {"nodeSelector": NOWHERE}},
        },
    }


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (to see which component the run was bound by)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def rss_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PodWatch:
    """Counts pods per job from one watch stream; records when each job has all its pods."""

    def __init__(self, session, jobs: int):
        self.s, self.jobs = session, jobs
        self.names: dict[str, set[str]] = {}
        self.complete: dict[str, float] = {}
        self.stop = threading.Event()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        rv = self.s.kube.request("GET", f"/api/v1/namespaces/{self.s.ns}/pods")["metadata"]["resourceVersion"]
        self.rv = rv
        self.thread.start()
        return self

    def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.s.ns}/pods"
        while not self.stop.is_set():
            try:
                for ev in self.s.kube.watch(path, self.rv, timeout_seconds=30):
                    obj = ev.get("object") or {}
                    self.rv = (obj.get("metadata") or {}).get("resourceVersion", self.rv)
                    if ev.get("type") != "ADDED":
                        continue
                    owner = (obj["metadata"].get("labels") or {}).get("ftjob.dev/job-name")
                    if owner:
                        seen = self.names.setdefault(owner, set())
                        seen.add(obj["metadata"]["name"])
                        if len(seen) >= PODS_PER_JOB:
                            self.complete.setdefault(owner, time.time())
                    if self.stop.is_set():
                        return
            except ApiError as e:  # 410 Gone: events were missed, the counts cannot be trusted
                if not self.stop.is_set():
                    self.error = e
                return
            except Exception as e:  # noqa: BLE001 - a dropped stream: watch again from the last version
                if self.stop.is_set():
                    return
                self.error_count = getattr(self, "error_count", 0) + 1
                if self.error_count > 5:
                    self.error = e
                    return
                time.sleep(0.5)


def run(args) -> dict:
    names = [f"bench-{i:04d}" for i in range(args.jobs)]
    answered: dict[str, float] = {}
    peak_sampled = 0
    with local_cluster(args.state_dir) as s:
        op_pid = s.cluster.alive("operator")["pid"]
        pids = {c: s.cluster.alive(c)["pid"] for c in ("apiserver", "node-agent", "operator")}
        cpu0 = {c: cpu_seconds(pid) for c, pid in pids.items()}
        watch = PodWatch(s, args.jobs).start()
        path = f"{GROUP_PATH}/namespaces/{s.ns}/trainingjobs"

        def create(name: str) -> None:
            try:
                s.kube.request("POST", path, body=job(name))
            except ApiError as e:
                raise SystemExit(f"creating {name} failed: {e}") from None
            answered[name] = time.time()

        t0 = time.time()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(create, names))
        applied_s = time.time() - t0
        deadline = time.monotonic() + args.timeout
        while len(watch.complete) < args.jobs and time.monotonic() < deadline and not watch.error:
            peak_sampled = max(peak_sampled, rss_kb(op_pid, "VmRSS") or 0)
            time.sleep(0.2)
        done = time.time()
        hwm = rss_kb(op_pid, "VmHWM")
        cpu = {
            c: round(cpu_seconds(pid) - cpu0[c], 1)
            for c, pid in pids.items()
            if cpu_seconds(pid) is not None and cpu0[c] is not None
        }
        watch.stop.set()
        pods = sum(len(v) for v in watch.names.values())
    latencies = sorted(watch.complete[n] - answered[n] for n in names if n in watch.complete)
    complete = len(latencies) == args.jobs
    all_pods_s = (max(watch.complete.values()) - t0) if complete else None
    peak_mb = (hwm or peak_sampled) / 1024

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2) if latencies else None

    return {
        "benchmark": "local_scale",
        "date": now_utc(),
        "machine": machine(),
        "jobs": args.jobs,
        "pods_expected": args.jobs * PODS_PER_JOB,
        "pods_created": pods,
        "jobs_complete": len(latencies),
        "apply_s": round(applied_s, 2),
        "all_pods_s": round(all_pods_s, 2) if all_pods_s is not None else None,
        "waited_s": round(done - t0, 2),
        "latency_p50_s": pct(0.50),
        "latency_p99_s": pct(0.99),
        "latency_mean_s": round(statistics.mean(latencies), 2) if latencies else None,
        "operator_peak_rss_mb": round(peak_mb, 1),
        "cpu_seconds": cpu,
        "watch_error": str(watch.error) if watch.error else None,
        "goal_all_pods_s": GOAL_ALL_PODS_S,
        "goal_rss_mb": GOAL_RSS_MB,
        "goal_met": complete and all_pods_s < GOAL_ALL_PODS_S and peak_mb < GOAL_RSS_MB,
    }


def markdown(r: dict) -> str:
    def fig(v, unit="s"):
        return "n/a" if v is None else f"{v:g} {unit}"

    return "\n".join(
        [
            "## Local cluster: operator scale (`bench/local_scale.py`)",
            "",
            f"{r['date']}; {r['machine']}.",
            f"{r['jobs']} TrainingJobs of 2 workers each (no-op command, pods left Pending on purpose) created with "
            f"{r['pods_expected']} pods expected; all create requests answered in {fig(r['apply_s'])}.",
            "",
            "| figure | value | goal |",
            "|---|---|---|",
            f"| first create -> all {r['pods_expected']} pods exist | **{fig(r['all_pods_s'])}** "
            f"({r['pods_created']} created, {r['jobs_complete']}/{r['jobs']} jobs complete) | < {r['goal_all_pods_s']:g} s |",
            f"| create -> a job's 3 pods, p50 / p99 | {fig(r['latency_p50_s'])} / {fig(r['latency_p99_s'])} | |",
            f"| operator peak RSS (VmHWM) | **{fig(r['operator_peak_rss_mb'], 'MB')}** | < {r['goal_rss_mb']:g} MB |",
            "",
            f"CPU seconds used during the run: {', '.join(f'{k} {v:g}' for k, v in r['cpu_seconds'].items())} "
            f"(2 cores, {r['waited_s']:g} s of wall time).",
            "",
            f"Goals {'met' if r['goal_met'] else 'NOT met'}."
            + (f" Watch error: {r['watch_error']}" if r["watch_error"] else ""),
        ]
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    res = run(args)
    print(json.dumps(res, indent=2))
    if not args.no_write:
        write_section("local_scale", markdown(res))
    return 0 if res["jobs_complete"] == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
