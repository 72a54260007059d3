"""Recovery after a spot preemption on the local cluster: the notice -> the first training step after the resume.

Runs examples/local-tiny.yaml (tiny model, CPU) at a fixed world size of 2 workers, preempts the node of a
worker a few times (default: no notice, so the notice is also the moment the pods are deleted; a fresh spot node
comes back at once) and times each recovery from the trainer's structured events (ftjob_local.timeline), the pods
and the job status. For each preemption, and as the median over them, per pod (the survivor, whose trainer
torchrun restarts in its pod, and the replacement pod), seconds after the signal:

  signal -> stop save committed -> process exit -> new worker process started -> imports done -> process group
  ready -> model built -> checkpoint loaded -> first step

and, from torchrun's own INFO lines in the pod logs (LOGLEVEL=INFO; torchrun writes no events), the replacement's
agent start-up (pod running -> its torchrun's first line) and the round (-> every agent completed the new c10d
round). Goal (issue 10): the notice -> first step after the resume, median of 3 preemptions <= 5 s with the tiny
model on 2 cores, 0 lost steps (trained twice or skipped).

With --spares N the job keeps N warm spare workers (spec.workers.spares; the cluster gets a spot node for each)
and each preemption takes a training worker's node: the spare takes its place in the rendezvous. --env NAME=VALUE
adds to the worker pods' environment: the arms of a comparison (ftjob_trainer.launch's switches, say).

    .venv/bin/python bench/local_recovery.py [--preemptions 3] [--notice 0] [--spares 1] [--env K=V] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import yaml
from ftjob_local.demo import DEFAULT_MANIFEST, demo_manifests, read_json, report_file
from ftjob_local.preempt import request_preemption
from ftjob_local.timeline import (
    MOMENTS,
    ROLES,
    Analysis,
    analyze,
    breakdown_rows,
    read_job_events,
    training_pods,
)
from local_common import local_cluster, machine, now_utc, write_section

GOAL_MEDIAN_SECONDS = 5.0
# torchrun's (glog-style) log lines: "I1202 15:04:23.123456 1234 torch/distributed/...py:123] message"
TORCHRUN_LINE = re.compile(r"^([IWE])(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)\s+\d+ \S+\] (.*)$")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preemptions", type=int, default=3, help="preemptions in the run (default 3)")
    p.add_argument("--notice", type=float, default=0.0, help="spot notice in seconds (default 0)")
    p.add_argument(
        "--replace-after", type=float, default=0.0, help="fresh spot node after S seconds (default 0)"
    )
    p.add_argument("--steps", type=int, default=120, help="training steps (default 120)")
    p.add_argument(
        "--state-dir", type=Path, default=None, help="cluster state folder (default: a temporary one)"
    )
    p.add_argument("--timeout", type=float, default=600, help="give up after S seconds (default 600)")
    p.add_argument("--no-write", action="store_true", help="print JSON only; leave bench/RESULTS.md alone")
    p.add_argument(
        "--spares",
        type=int,
        default=0,
        help="warm spare worker pods (spec.workers.spares; one more spot node each; default 0)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="more environment for the worker pods (repeatable), e.g. an arm of a comparison: "
        "FTJOB_WARM_WORKERS=0",
    )
    args = p.parse_args(argv)
    if any("=" not in e for e in args.env):
        p.error("--env takes NAME=VALUE")
    if args.preemptions < 1 or args.steps < 10 * (args.preemptions + 1):
        p.error("--preemptions must be >= 1 and --steps >= 10 x (preemptions + 1)")
    return args


def torchrun_events(log_dir: Path, job: str) -> dict[str, list[tuple[float, str]]]:
    """pod -> [(time, message)] of torchrun's own log lines (the year is not in them: this year's)."""
    year = datetime.now().year
    out: dict[str, list[tuple[float, str]]] = {}
    for pod_dir in sorted(log_dir.glob(f"{job}-worker-*")):
        for f in sorted(pod_dir.glob("*.log")):
            for line in f.read_text(errors="replace").splitlines():
                m = TORCHRUN_LINE.match(line)
                if m:
                    t = datetime.strptime(
                        f"{year}{m.group(2)}{m.group(3)} {m.group(4)[:15]}", "%Y%m%d %H:%M:%S.%f"
                    )
                    out.setdefault(pod_dir.name, []).append((t.timestamp(), m.group(5)))
    return out


def round_parts(
    events: dict[str, list[tuple[float, str]]], replacement: str, after: float, before: float
) -> dict[str, float]:
    """When the replacement's torchrun logged first, and when the last agent completed the round that started
    training again (between `after`, the notice, and `before`, rank 0's start in that round)."""
    parts: dict[str, float] = {}
    mine = [t for t, _ in events.get(replacement, []) if t > after]
    if mine:
        parts["agent_up"] = min(mine)
    joined = [
        max(
            (t for t, msg in ev if after < t <= before and "Rendezvous complete for workers" in msg),
            default=None,
        )
        for ev in events.values()
    ]
    joined = [t for t in joined if t is not None]
    if joined:
        parts["round_joined"] = max(joined)
    return parts


def job_docs(steps: int, env: list[str] = (), spares: int = 0) -> tuple[list[dict], dict]:
    docs, job = demo_manifests(DEFAULT_MANIFEST)  # + log-every 1 and the report, as the demo runs it
    spec = job["spec"]
    spec["trainer"]["steps"] = steps
    # a resume needs the replacement (or a warm spare): its path is what is measured
    spec["workers"] = {"min": 2, "max": 2, "spares": spares}
    spec.setdefault("podTemplate", {})["env"] = [
        {"name": "OMP_NUM_THREADS", "value": "1"},  # 2 ranks, 2 cores
        {"name": "LOGLEVEL", "value": "INFO"},  # torchrun's rendezvous steps, with times, in the pod logs
        *({"name": k, "value": v} for k, v in (e.split("=", 1) for e in env)),
    ]
    return docs, job


def run(args) -> dict:
    docs, job = job_docs(args.steps, args.env, args.spares)
    name = job["metadata"]["name"]
    targets = [args.steps * (i + 1) // (args.preemptions + 1) for i in range(args.preemptions)]
    notices: list[tuple[float, str]] = []
    created: dict[str, float] = {}
    running: dict[str, float] = {}
    with local_cluster(args.state_dir, spot_nodes=2 + args.spares) as s:
        report = report_file(s.cluster, s.ns, job)
        s.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs, sort_keys=False))
        deadline = time.monotonic() + args.timeout
        while True:
            if time.monotonic() > deadline:
                raise SystemExit(f"the job did not finish in {args.timeout:g}s; see {s.cluster.log_dir}")
            now = time.time()
            status = (s.job(name) or {}).get("status") or {}
            pods = s.pods(name)
            for p in pods:
                n = p["metadata"]["name"]
                created.setdefault(n, now)
                if (p.get("status") or {}).get("phase") == "Running":
                    running.setdefault(n, now)
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            step = (read_json(report) or {}).get("step") or 0
            ready = (status.get("workers") or {}).get("ready", 0)
            pods_up = len(
                [n for n in running if "-worker-" in n and n in {p["metadata"]["name"] for p in pods}]
            )
            if (
                len(notices) < len(targets)
                and step >= targets[len(notices)]
                and ready == 2
                and pods_up >= 2 + args.spares
            ):
                # a node with a training worker, never a spare's (it would cost training nothing)
                training = training_pods(read_job_events(s.cluster.dir, s.ns, name))
                node = s.node_of_worker(name, among=training)
                if node:
                    request_preemption(s.kube, node, notice=args.notice, replace_after=args.replace_after)
                    notices.append((time.time(), node))
            time.sleep(0.1)
        a = analyze(read_job_events(s.cluster.dir, s.ns, name))
        agents = torchrun_events(s.cluster.dir / "logs" / s.ns, name)
        final = status
    recoveries = [recovery(a, t, node, created, running, agents) for t, node in notices]
    return {
        "benchmark": "local_recovery",
        "date": now_utc(),
        "machine": machine(),
        "job": {
            "manifest": str(DEFAULT_MANIFEST.name),
            "steps": args.steps,
            "workers": "2:2",
            "spares": args.spares,
            "notice_s": args.notice,
            "replace_after_s": args.replace_after,
            "env": args.env,
        },
        "phase": final.get("phase"),
        "preemptions": final.get("preemptions"),
        "failures": final.get("failures"),
        "lost_steps": a.lost_steps,
        "trained_twice": a.trained_twice,
        "skipped": a.skipped,
        **summary(recoveries, a),
    }


def recovery(
    a: Analysis,
    t_notice: float,
    node: str,
    created: dict[str, float],
    running: dict[str, float],
    agents: dict[str, list[tuple[float, str]]],
) -> dict:
    """One preemption: its totals and, per pod role, the seconds after the signal of every moment."""
    r = next((r for r in a.resumes if r.t_loaded > t_notice), None)
    if r is None or r.t_first_step is None:
        return {"node": node, "error": "no resume with a first step after this notice in the events"}
    out: dict = {
        "node": node,
        "stopped_at_step": r.stop_steps,
        "resumed_from_step": r.from_step,
        "total_s": round(r.t_first_step - t_notice, 2),  # the goal's figure: notice -> first step
        "signal_to_first_step_s": None if r.t_signal is None else round(r.t_first_step - r.t_signal, 2),
        "save_s": None if r.save_seconds is None else round(r.save_seconds, 2),
        "pods": {},
    }
    for rec in r.pods:
        out["pods"][rec.role] = {
            "pod": rec.pod,
            "since_signal_s": {
                m: None if since is None else round(since, 3) for m, since, _ in breakdown_rows(rec)
            },
            "load_bytes": rec.load_bytes,
            "load_gbps": rec.load_gbps,
        }
    fresh = sorted((t, n) for n, t in created.items() if "-worker-" in n and t > t_notice)
    replacement = r.pod("replacement")
    if replacement is not None and created.get(replacement.pod, t_notice) < t_notice:
        # a warm spare took the place: its agent was up and waiting; the round is counted from the notice
        out["spare_warm_for_s"] = round(t_notice - running.get(replacement.pod, created[replacement.pod]), 2)
        rounds = round_parts(agents, replacement.pod, t_notice, r.t_started)
        if "round_joined" in rounds:
            out["rendezvous_s"] = {
                "agent_startup": None,
                "round": round(rounds["round_joined"] - t_notice, 2),
            }
    elif fresh and replacement is not None:
        out["replacement_created_s"] = round(fresh[0][0] - t_notice, 2)
        t_run = running.get(replacement.pod, fresh[0][0])
        rounds = round_parts(agents, replacement.pod, t_notice, r.t_started)
        if "agent_up" in rounds and "round_joined" in rounds:
            out["rendezvous_s"] = {
                "agent_startup": round(rounds["agent_up"] - t_run, 2),
                "round": round(rounds["round_joined"] - rounds["agent_up"], 2),
            }
    return out


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def summary(recoveries: list[dict], a: Analysis) -> dict:
    """The recoveries, and the median over them of the totals and of every moment per role."""
    done = [r for r in recoveries if "total_s" in r]
    median_total = _median([r["total_s"] for r in done])
    return {
        "recoveries": recoveries,
        "median_total_s": median_total,
        "median_signal_to_first_step_s": _median([r["signal_to_first_step_s"] for r in done]),
        "median_since_signal_s": {
            role: {
                m: _median([r["pods"][role]["since_signal_s"][m] for r in done if role in r["pods"]])
                for m in MOMENTS
            }
            for role in ROLES
        },
        "goal_median_total_s": GOAL_MEDIAN_SECONDS,
        "goal_met": median_total is not None and median_total <= GOAL_MEDIAN_SECONDS and a.lost_steps == 0,
    }


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(res: dict) -> str:
    rows = [r for r in res["recoveries"] if "total_s" in r]
    lines = [
        "## Local cluster: recovery after a preemption (`bench/local_recovery.py`)",
        "",
        f"{res['date']}; {res['machine']}.",
        f"Job: {res['job']['manifest']} (tiny model, CPU), {res['job']['steps']} steps, 2:2 workers, "
        f"{res['job'].get('spares', 0)} warm spare(s), notice "
        f"{res['job']['notice_s']:g} s, replacement node after {res['job']['replace_after_s']:g} s. "
        f"Phase {res['phase']}, {res['preemptions']} preemption(s), {res['failures']} failure(s), "
        f"lost steps {res['lost_steps']} (trained twice {res['trained_twice']}, skipped {res['skipped']}).",
        "",
        "Per preemption, seconds (total: the notice -> rank 0's first step after the resume):",
        "",
        "| preemption | total | signal -> first step | save | replacement created | agent start-up | round "
        "| resumed from |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        rdv = r.get("rendezvous_s") or {}
        lines.append(
            f"| {i} | **{r['total_s']:.2f}** | {_s(r['signal_to_first_step_s'])} | {_s(r['save_s'])} "
            f"| {_s(r.get('replacement_created_s'))} | {_s(rdv.get('agent_startup'))} | {_s(rdv.get('round'))} "
            f"| {r['resumed_from_step']} |"
        )
    med = res["median_since_signal_s"]
    lines += [
        "",
        f"The breakdown, median over the {len(rows)} preemption(s), seconds after the signal (from the trainer's "
        "events; a replacement's process exit is the preempted pod's):",
        "",
        "| moment | " + " | ".join(ROLES) + " |",
        "|---|" + "---|" * len(ROLES),
    ]
    for m in MOMENTS:
        lines.append(f"| {m.replace('_', ' ')} | " + " | ".join(_s(med[role][m]) for role in ROLES) + " |")
    lines += [
        "",
        f"Goal: the notice -> first step, median <= {res['goal_median_total_s']:g} s with 0 lost steps: "
        f"{'met' if res['goal_met'] else 'NOT met'} (median {res['median_total_s']} s).",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    res = run(args)
    print(json.dumps(res, indent=2))
    if not args.no_write:
        write_section("local_recovery", markdown(res))
    return 0 if res["phase"] == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
