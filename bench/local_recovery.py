"""Recovery after a spot preemption on the local cluster: SIGTERM -> first training step after the resume.

Runs examples/local-tiny.yaml (tiny model, CPU) at a fixed world size of 2 workers, preempts the node of a
worker a few times (default: no notice, so the notice is also the moment the pods are deleted; a fresh spot node
comes back at once) and times each recovery from the notice, from the trainer's log lines, the pods and the job
status. The parts:

  save                 the trainer's own measure, SIGTERM -> stop checkpoint committed
  replacement created  notice -> the operator's replacement pod exists
  rendezvous           max(replacement running, save committed) -> rank 0 of the new round starts, itself split
                       from torchrun's own INFO lines (LOGLEVEL=INFO in the pods) into:
    agent start-up     replacement running -> its torchrun logs its first line
    round              -> every agent has completed the new c10d round (torchrun: 'Rendezvous complete')
    worker start-up    -> rank 0's trainer process logs its config (Python and torch imported)
  setup                rank 0 started -> process group up, model built and sharded
  checkpoint load      -> the checkpoint is loaded (DCP)
  first step           -> the first optimizer step after the resume is done
  total                notice -> that first step
Goal: total under 15 s with the tiny model on 2 cores (replacement node delay excluded: the other spot node has
room, and --replace-after 0). Lost steps (trained twice or skipped) per preemption with notice: 0.

    .venv/bin/python bench/local_recovery.py [--preemptions 2] [--notice 0] [--no-write]
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
from ftjob_local.demo import DEFAULT_MANIFEST, analyze, demo_manifests, read_job_logs, read_json, report_file
from ftjob_local.preempt import request_preemption
from local_common import local_cluster, machine, now_utc, write_section

GOAL_SECONDS = 15.0
# torchrun's (glog-style) log lines: "I1202 15:04:23.123456 1234 torch/distributed/...py:123] message"
TORCHRUN_LINE = re.compile(r"^([IWE])(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)\s+\d+ \S+\] (.*)$")
PARTS = ("save", "replacement_created", "rendezvous", "setup", "checkpoint_load", "first_step")
RENDEZVOUS_PARTS = ("agent_startup", "round", "worker_startup")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preemptions", type=int, default=2, help="preemptions in the run (default 2)")
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
    args = p.parse_args(argv)
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


def job_docs(steps: int) -> tuple[list[dict], dict]:
    docs, job = demo_manifests(DEFAULT_MANIFEST)  # + log-every 1 and the report, as the demo runs it
    spec = job["spec"]
    spec["trainer"]["steps"] = steps
    spec["workers"] = {"min": 2, "max": 2}  # a resume needs the replacement: its path is what is measured
    spec.setdefault("podTemplate", {})["env"] = [
        {"name": "OMP_NUM_THREADS", "value": "1"},  # 2 ranks, 2 cores
        {"name": "LOGLEVEL", "value": "INFO"},  # torchrun's rendezvous steps, with times, in the pod logs
    ]
    return docs, job


def run(args) -> dict:
    docs, job = job_docs(args.steps)
    name = job["metadata"]["name"]
    targets = [args.steps * (i + 1) // (args.preemptions + 1) for i in range(args.preemptions)]
    notices: list[tuple[float, str]] = []
    created: dict[str, float] = {}
    running: dict[str, float] = {}
    with local_cluster(args.state_dir) as s:
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
            if len(notices) < len(targets) and step >= targets[len(notices)] and ready == 2:
                node = s.node_of_worker(name)
                if node:
                    request_preemption(s.kube, node, notice=args.notice, replace_after=args.replace_after)
                    notices.append((time.time(), node))
            time.sleep(0.1)
        a = analyze(read_job_logs(s.cluster.dir, s.ns, name))
        events = torchrun_events(s.cluster.dir / "logs" / s.ns, name)
        final = status
    recoveries = []
    for t_notice, node in notices:
        r = next((r for r in a.resumes if r.t_resumed > t_notice), None)
        fresh = sorted((t, n) for n, t in created.items() if "-worker-" in n and t > t_notice)
        if r is None or r.t_signal is None or r.t_first_step is None or not fresh:
            recoveries.append({"node": node, "error": "no complete recovery found in the logs"})
            continue
        pod = fresh[0][1]
        t_run = running.get(pod, fresh[0][0])
        start = max(t_run, r.t_commit or r.t_signal)
        parts = {
            "save": r.save_seconds,
            "replacement_created": fresh[0][0] - t_notice,
            "rendezvous": r.t_config - start,
            "setup": (r.t_sharded or r.t_config) - r.t_config,
            "checkpoint_load": r.t_resumed - (r.t_sharded or r.t_config),
            "first_step": r.t_first_step - r.t_resumed,
        }
        rounds = round_parts(events, pod, t_notice, r.t_config)
        if "agent_up" in rounds and "round_joined" in rounds:
            parts["agent_startup"] = rounds["agent_up"] - t_run
            parts["round"] = rounds["round_joined"] - rounds["agent_up"]
            parts["worker_startup"] = r.t_config - rounds["round_joined"]
        since_notice = {
            "sigterm": r.t_signal,
            "save_committed": r.t_commit,
            "replacement_created": fresh[0][0],
            "replacement_running": t_run,
            "replacement_agent_up": rounds.get("agent_up"),
            "round_joined": rounds.get("round_joined"),
            "new_round_started": r.t_config,
            "model_sharded": r.t_sharded,
            "checkpoint_loaded": r.t_resumed,
            "first_step": r.t_first_step,
        }
        recoveries.append(
            {
                "node": node,
                "stopped_at_step": r.stop_steps,
                "resumed_from_step": r.from_step,
                "total_s": round(r.t_first_step - t_notice, 2),
                "parts_s": {k: round(v, 2) for k, v in parts.items()},
                "since_notice_s": {
                    k: round(v - t_notice, 2) for k, v in since_notice.items() if v is not None
                },
            }
        )
    totals = [r["total_s"] for r in recoveries if "total_s" in r]
    return {
        "benchmark": "local_recovery",
        "date": now_utc(),
        "machine": machine(),
        "job": {
            "manifest": str(DEFAULT_MANIFEST.name),
            "steps": args.steps,
            "workers": "2:2",
            "notice_s": args.notice,
            "replace_after_s": args.replace_after,
        },
        "phase": final.get("phase"),
        "preemptions": final.get("preemptions"),
        "failures": final.get("failures"),
        "lost_steps": a.lost_steps,
        "trained_twice": a.trained_twice,
        "skipped": a.skipped,
        "recoveries": recoveries,
        "median_total_s": statistics.median(totals) if totals else None,
        "goal_total_s": GOAL_SECONDS,
        "goal_met": bool(totals) and max(totals) < GOAL_SECONDS and a.lost_steps == 0,
    }


def markdown(res: dict) -> str:
    rows = [r for r in res["recoveries"] if "total_s" in r]
    head = "| preemption | total | " + " | ".join(p.replace("_", " ") for p in PARTS) + " | resumed from |"
    lines = [
        "## Local cluster: recovery after a preemption (`bench/local_recovery.py`)",
        "",
        f"{res['date']}; {res['machine']}.",
        f"Job: {res['job']['manifest']} (tiny model, CPU), {res['job']['steps']} steps, 2:2 workers, notice "
        f"{res['job']['notice_s']:g} s, replacement node after {res['job']['replace_after_s']:g} s. "
        f"Phase {res['phase']}, {res['preemptions']} preemption(s), {res['failures']} failure(s), "
        f"lost steps {res['lost_steps']} (trained twice {res['trained_twice']}, skipped {res['skipped']}).",
        "",
        "Seconds (total: from the notice to the first step after the resume; parts as in the script's "
        "docstring):",
        "",
        head,
        "|" + "---|" * (len(PARTS) + 3),
    ]
    for i, r in enumerate(rows, 1):
        parts = " | ".join(f"{r['parts_s'][p]:.2f}" for p in PARTS)
        lines.append(f"| {i} | **{r['total_s']:.2f}** | {parts} | {r['resumed_from_step']} |")
    split = [r for r in rows if all(p in r["parts_s"] for p in RENDEZVOUS_PARTS)]
    if split:
        lines += [
            "",
            "The rendezvous part, from torchrun's own log lines:",
            "",
            "| preemption | " + " | ".join(p.replace("_", " ") for p in RENDEZVOUS_PARTS) + " |",
            "|" + "---|" * (len(RENDEZVOUS_PARTS) + 1),
        ]
        for i, r in enumerate(split, 1):
            lines.append(f"| {i} | " + " | ".join(f"{r['parts_s'][p]:.2f}" for p in RENDEZVOUS_PARTS) + " |")
    lines += [
        "",
        f"Goal: under {res['goal_total_s']:g} s with 0 lost steps: "
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
