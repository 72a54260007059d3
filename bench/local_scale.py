"""Operator scale on the local cluster: N TrainingJobs of 2 workers each, applied at once, at several sizes.

Each job runs a no-op trainer command and its pods ask for a node label no node has, so they stay Pending: the
benchmark measures the operator and the API server (watch, plan, create a Secret, a Service, a coordinator and 2
workers per job), not thousands of processes starting on 2 cores. Each size runs on a fresh cluster. Per size:

  all_pods_s        first create request -> the last pod exists
  latency p50/p99   a job's create request answered -> its 3 pods exist
  peak RSS          each component's peak resident memory (VmHWM)
  CPU seconds       each component's (API server, operator, the others, this client), in all and per job
  requests per job  the API server's request counts (its /metrics) over the jobs: flat when nothing per job
                    grows with the cluster
and between sizes the growth exponent of all_pods_s: log(t2 / t1) / log(n2 / n1) (1.0: the time grows as the jobs
do, the cost per job stays flat), between consecutive sizes and from the first size to the last.

Every size has a time limit (--timeout, creates included): a size over it stops there, is recorded as "over its
limit" with what it reached, and the run goes on with the next size. With --out DIR, DIR/results.json is rewritten
after each size (a run stopped midway keeps the sizes it finished) and DIR/results.md holds the table.

Goals (issue 15): at 5,000 jobs all pods exist in <= 300 s and the operator's peak RSS is <= 500 MB; from 500 to
5,000 jobs the exponent is <= 1.1. At 500 to 4,999 jobs, the 500-job goals: < 60 s, operator RSS < 300 MB.

    .venv/bin/python bench/local_scale.py --sizes 500,1000,2000,5000 --out DIR    # on a quiet 2-core machine
    .venv/bin/python bench/local_scale.py --sizes 100,200 --no-write              # a smoke run

--profile DIR: a cProfile of the API server's and the operator's event loops per size, written when they stop
(bench/profiling/sitecustomize.py says how to read them). py-spy, where installed, needs no hook:
`py-spy record -p PID -f raw -o FILE` on a component's pid while a size runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ftjob_local.client import ApiError
from ftjob_local.session import GROUP_PATH
from local_common import local_cluster, machine, now_utc, write_section

PODS_PER_JOB = 3  # coordinator + 2 workers
NOWHERE = {"ftjob.dev/bench": "no-such-node"}
COMPONENTS = ("apiserver", "operator", "node-agent", "proxy")
PROFILING = Path(__file__).resolve().parent / "profiling"
# (jobs, seconds to all pods, operator peak RSS MB): the goal of the largest size at or below a run's size
GOALS = ((500, 60.0, 300.0), (5000, 300.0, 500.0))
GOAL_EXPONENT = 1.1  # from 500 to 5,000 jobs
REQUESTS_SHOWN = 0.1  # request kinds of at least this many per job go in the table


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", default="500", help="comma-separated job counts, a fresh cluster each (default 500)"
    )
    p.add_argument("--clients", type=int, default=8, help="concurrent create requests (default 8)")
    p.add_argument(
        "--timeout", type=float, default=600, help="time limit of each size, creates included (default 600 s)"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="write results.json (after each size) and results.md"
    )
    p.add_argument(
        "--profile", type=Path, default=None, help="write each component's cProfile here, per size"
    )
    p.add_argument("--no-write", action="store_true", help="leave bench/RESULTS.md alone")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        p.error("--sizes takes comma-separated whole numbers, e.g. 500,1000")
    if not args.sizes or min(args.sizes) < 1 or args.clients < 1 or args.timeout <= 0:
        p.error("every size, --clients and --timeout must be positive")
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
    """User + system CPU time of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def own_cpu_seconds() -> float:
    usage = resource.getrusage(
        resource.RUSAGE_SELF
    )  # every thread of this process: the clients and the watch
    return usage.ru_utime + usage.ru_stime


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def api_requests(session) -> dict[str, int]:
    """The API server's request counts (its /metrics): "VERB resource[/subresource]" -> count."""
    url = session.kube.client.configuration.host + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(","))
        label = {k: v.strip('"') for k, v in labels.items()}
        key = f"{label['verb']} {label['resource']}" + (
            f"/{label['subresource']}" if label["subresource"] else ""
        )
        counts[key] = counts.get(key, 0) + int(line.rsplit(" ", 1)[1])
    return counts


class PodWatch:
    """Counts pods per job from one watch stream; records when each job has all its pods."""

    def __init__(self, session):
        self.s = session
        self.names: dict[str, set[str]] = {}
        self.complete: dict[str, float] = {}
        self.stop = threading.Event()
        self.error: Exception | None = None
        self.dropped = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        self.rv = self.s.kube.request("GET", f"/api/v1/namespaces/{self.s.ns}/pods")["metadata"][
            "resourceVersion"
        ]
        self.thread.start()
        return self

    def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.s.ns}/pods"
        while not self.stop.is_set():
            try:
                for ev in self.s.kube.watch(path, self.rv, timeout_seconds=30):
                    obj = ev.get("object") or {}
                    self.rv = (obj.get("metadata") or {}).get("resourceVersion", self.rv)
                    owner = (obj.get("metadata", {}).get("labels") or {}).get("ftjob.dev/job-name")
                    if ev.get("type") == "ADDED" and owner:
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
                self.dropped += 1
                if self.dropped > 5:
                    self.error = e
                    return
                time.sleep(0.5)


def goals_for(jobs: int) -> tuple[int, float, float] | None:
    """The goal (jobs, seconds, MB) of the largest goal size at or below `jobs`."""
    fitting = [g for g in GOALS if g[0] <= jobs]
    return fitting[-1] if fitting else None


def _per_job(values: dict[str, float], jobs: int, scale: float = 1.0) -> dict[str, float]:
    return {k: round(scale * v / jobs, 2) for k, v in values.items()}


def run_size(args, jobs: int) -> dict:
    """One size on a fresh cluster, within args.timeout seconds from the first create."""
    names = [f"bench-{i:05d}" for i in range(jobs)]
    answered: dict[str, float] = {}
    failed: list[str] = []  # creates the API server refused or did not answer: the size is recorded as failed
    if args.profile:
        folder = args.profile / f"{jobs}-jobs"
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["FTJOB_PROFILE_DIR"] = str(folder.resolve())
    load_before = os.getloadavg()[0]
    with local_cluster(None) as s:
        pids = {c: rec["pid"] for c in COMPONENTS if (rec := s.cluster.alive(c))}
        cpu0 = {c: cpu_seconds(pid) for c, pid in pids.items()}
        own0 = own_cpu_seconds()
        requests0 = api_requests(s)
        watch = PodWatch(s).start()
        path = f"{GROUP_PATH}/namespaces/{s.ns}/trainingjobs"
        t0 = time.time()
        deadline = time.monotonic() + args.timeout

        def create(name: str) -> None:
            if time.monotonic() > deadline:
                return  # over the limit: the rest are not created, and the size is recorded as such
            try:
                s.kube.request("POST", path, body=job(name))
            except Exception as e:  # noqa: BLE001 - an API error or a timeout: recorded, the next size still runs
                failed.append(f"creating {name} failed: {type(e).__name__}: {e}")
                return
            answered[name] = time.time()

        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(create, names))
        applied_s = time.time() - t0
        while len(watch.complete) < jobs and time.monotonic() < deadline and not watch.error:
            time.sleep(0.2)
        done = time.time()
        rss = {c: rss_mb(pid) for c, pid in pids.items()}
        cpu = {
            c: round(now - cpu0[c], 2)
            for c, pid in pids.items()
            if None not in (now := cpu_seconds(pid), cpu0[c])
        }
        cpu["others"] = round(sum(v for c, v in cpu.items() if c not in ("apiserver", "operator")), 2)
        cpu["bench client"] = round(own_cpu_seconds() - own0, 2)
        requests = {k: v - requests0.get(k, 0) for k, v in api_requests(s).items()}
        watch.stop.set()
        pods = sum(len(v) for v in watch.names.values())
    os.environ.pop("FTJOB_PROFILE_DIR", None)
    latencies = sorted(
        watch.complete[n] - answered[n] for n in names if n in watch.complete and n in answered
    )
    complete = len(watch.complete) == jobs and not watch.error and not failed
    all_pods_s = round(max(watch.complete.values()) - t0, 2) if complete else None
    if complete:
        status = "complete"
    elif failed:
        status = f"{len(failed)} creates failed, the first: {failed[0]}"
    elif watch.error:
        status = f"the pod watch failed: {watch.error}"
    else:
        status = f"over its limit ({args.timeout:g} s): {len(watch.complete)}/{jobs} jobs had their pods"

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2) if latencies else None

    goal = goals_for(jobs)
    return {
        "jobs": jobs,
        "status": status,
        "over_limit": not complete and not watch.error and not failed,
        "limit_s": args.timeout,
        "jobs_created": len(answered),
        "jobs_complete": len(watch.complete),
        "pods_expected": jobs * PODS_PER_JOB,
        "pods_created": pods,
        "apply_s": round(applied_s, 2),
        "all_pods_s": all_pods_s,
        "waited_s": round(done - t0, 2),
        "latency_p50_s": pct(0.50),
        "latency_p99_s": pct(0.99),
        "latency_mean_s": round(statistics.mean(latencies), 2) if latencies else None,
        "peak_rss_mb": rss,
        "cpu_seconds": cpu,
        "cpu_ms_per_job": _per_job(cpu, jobs, 1000),
        "requests_per_job": dict(sorted(_per_job(requests, jobs).items(), key=lambda kv: -kv[1])),
        "load_average_before": round(load_before, 2),
        "goal": {"all_pods_s": goal[1], "operator_rss_mb": goal[2]} if goal else None,
        "goal_met": (
            None
            if goal is None
            else complete and all_pods_s <= goal[1] and (rss.get("operator") or 0) <= goal[2]
        ),
    }


def size_failed(args, jobs: int, why: str) -> dict:
    """The record of a size that could not run (the cluster did not start, ...): the next size still runs."""
    goal = goals_for(jobs)
    return {
        "jobs": jobs,
        "status": f"failed: {why}",
        "over_limit": False,
        "limit_s": args.timeout,
        "jobs_created": 0,
        "jobs_complete": 0,
        "pods_expected": jobs * PODS_PER_JOB,
        "pods_created": 0,
        "all_pods_s": None,
        "latency_p50_s": None,
        "latency_p99_s": None,
        "peak_rss_mb": {},
        "cpu_seconds": {},
        "cpu_ms_per_job": {},
        "requests_per_job": {},
        "load_average_before": round(os.getloadavg()[0], 2),
        "goal": {"all_pods_s": goal[1], "operator_rss_mb": goal[2]} if goal else None,
        "goal_met": None if goal is None else False,
    }


def exponent(a: dict, b: dict) -> dict:
    """log(t_b / t_a) / log(n_b / n_a) of the time to all pods; when b went over its limit, the exponent that its
    limit alone gives (the real one is larger)."""
    out = {"from": a["jobs"], "to": b["jobs"], "exponent": None, "at_least": None}
    if a["all_pods_s"] and a["jobs"] != b["jobs"]:
        if b["all_pods_s"]:
            out["exponent"] = round(
                math.log(b["all_pods_s"] / a["all_pods_s"]) / math.log(b["jobs"] / a["jobs"]), 3
            )
        elif b["over_limit"]:
            out["at_least"] = round(
                math.log(b["limit_s"] / a["all_pods_s"]) / math.log(b["jobs"] / a["jobs"]), 3
            )
    return out


def summarize(args, runs: list[dict]) -> dict:
    steps = [exponent(a, b) for a, b in zip(runs, runs[1:], strict=False)]
    overall = exponent(runs[0], runs[-1]) if len(runs) > 1 else None
    spans_goal = runs[0]["jobs"] <= 500 and runs[-1]["jobs"] >= 5000
    return {
        "benchmark": "local_scale",
        "date": now_utc(),
        "machine": machine(),
        "sizes": args.sizes,
        "limit_s": args.timeout,
        "runs": runs,
        "growth": steps,
        "growth_first_to_last": overall,
        "goal_exponent": GOAL_EXPONENT if spans_goal else None,
        "goal_met": all(r["status"] == "complete" and r["goal_met"] is not False for r in runs)
        and len(runs) == len(args.sizes)
        and (not spans_goal or (overall["exponent"] is not None and overall["exponent"] <= GOAL_EXPONENT)),
    }


def _fig(v, unit="s") -> str:
    return "n/a" if v is None else f"{v:g}{unit and ' ' + unit}"


def _growth(g: dict) -> str:
    if g["exponent"] is not None:
        return f"{g['exponent']:g}"
    return f"> {g['at_least']:g} (over its limit)" if g["at_least"] is not None else "n/a"


def markdown(r: dict) -> str:
    def cpu(values: dict) -> str:
        return " / ".join(
            f"{values.get(c, 0):g}" for c in ("apiserver", "operator", "others", "bench client")
        )

    lines = [
        "## Local cluster: operator scale (`bench/local_scale.py`)",
        "",
        f"{r['date']}; {r['machine']}. Sizes {', '.join(str(n) for n in r['sizes'])}, a fresh cluster each, "
        f"{r['limit_s']:g} s limit per size; TrainingJobs of 2 workers (no-op command, pods left Pending on "
        "purpose), all created at once by 8 clients. CPU columns: API server / operator / others (node agent, "
        "service proxy) / the benchmark's own client.",
        "",
        "| jobs (pods) | first create -> all pods exist | create -> a job's pods, p50 / p99 | operator peak RSS "
        "| CPU s | CPU ms per job | API requests per job | load before | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["runs"]:
        goal = x["goal"]
        goal_text = "" if goal is None else (
            f"{'met' if x['goal_met'] else 'NOT met'} (<= {goal['all_pods_s']:g} s, <= {goal['operator_rss_mb']:g} MB)"
        )  # fmt: skip
        reached = "" if x["status"] == "complete" else f" {x['status']};"
        shown = [f"{k} {v:g}" for k, v in x["requests_per_job"].items() if v >= REQUESTS_SHOWN]
        lines.append(
            f"| {x['jobs']} ({x['pods_expected']}) | **{_fig(x['all_pods_s'])}** ({reached} {x['pods_created']} "
            f"pods) | {_fig(x['latency_p50_s'])} / {_fig(x['latency_p99_s'])} | "
            f"{_fig(x['peak_rss_mb'].get('operator'), 'MB')} | {cpu(x['cpu_seconds'])} | "
            f"{cpu(x['cpu_ms_per_job'])} | {', '.join(shown)} | {x['load_average_before']:g} | {goal_text} |"
        )
    if r["growth"]:
        overall = r["growth_first_to_last"]
        lines += [
            "",
            "Growth exponent of the time to all pods, log(t2/t1) / log(n2/n1): "
            + ", ".join(f"{g['from']} -> {g['to']}: {_growth(g)}" for g in r["growth"])
            + f"; first -> last: **{_growth(overall)}**"
            + (f" (goal <= {r['goal_exponent']:g})." if r["goal_exponent"] else "."),
        ]
    lines += ["", f"Goals {'met' if r['goal_met'] else 'NOT met'}."]
    return "\n".join(lines)


def write_json(out: Path | None, result: dict) -> None:
    if out is not None:
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(out / "results.json")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        # the components import bench/profiling/sitecustomize.py at start-up (it profiles when the folder is set)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(PROFILING), os.environ.get("PYTHONPATH")])
        )
    runs: list[dict] = []
    for jobs in args.sizes:
        print(f"local_scale: {jobs} jobs (limit {args.timeout:g} s) ...", file=sys.stderr, flush=True)
        try:
            runs.append(run_size(args, jobs))
        except (Exception, SystemExit) as e:  # noqa: BLE001 - recorded as such; the other sizes still run
            runs.append(size_failed(args, jobs, f"{type(e).__name__}: {e}"))
        print(
            json.dumps(runs[-1]), file=sys.stderr, flush=True
        )  # each size as it ends: a long run shows progress
        write_json(args.out, summarize(args, runs))
    result = summarize(args, runs)
    print(json.dumps(result, indent=2))
    if args.out:
        (args.out / "results.md").write_text(markdown(result) + "\n")
    if not args.no_write:
        write_section("local_scale", markdown(result))
    return 0 if all(x["status"] == "complete" for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
