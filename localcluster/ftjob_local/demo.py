"""`ftjob demo`: watch a TrainingJob survive a spot preemption on the embedded local cluster.

In order: start a local cluster (an on-demand node for the coordinator, two spot nodes for the workers, the
operator), install the CRD with kubectl, apply examples/local-tiny.yaml, preempt the node of a worker mid-run
with notice (a fresh spot node comes back after --replace-after), show live progress, wait for Succeeded, then
print a timeline and the breakdown of the recovery, and write a PNG of step vs time. The cluster is torn down on
every path, Ctrl-C included, unless --keep.

The timeline is read from what the parts record anyway: the trainer's structured events in the pod logs
(ftjob_local.timeline), the pods' creation times, and the job's status and events. The demo only adds two trainer
flags to the job it applies: `log-every: 1` (a step event per step, so steps trained twice or skipped can be
counted exactly) and `report` (the trainer's JSON report on the checkpoint volume). demo_render.py shows it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from ftjob_trainer import contract

from .cluster import ClusterError, LocalCluster
from .demo_render import plot, print_goodput, print_timeline, progress_table
from .session import CRD_DIR, REPO, Session, SessionError, event_time
from .timeline import Analysis, Resume, analyze, breakdown_rows, of, read_job_events, training_pods

DEFAULT_MANIFEST = REPO / "examples" / "local-tiny.yaml"
REPORT_NAME = "demo-report.json"
# The operator's and the nodes' event reasons the timeline shows.
JOB_REASONS = (
    "TerminationNotice",
    "Preempted",
    "Replaced",
    "Recovered",
    "WorkerFailed",
    "RestartBackoff",
    "Restarted",
    "Succeeded",
    "BackoffLimitExceeded",
)
NODE_REASONS = ("SpotInterruption", "NodeTerminated")


class DemoError(SessionError):
    """The demo cannot go on; the message says why and what to look at."""


def demo_manifests(path: Path, report_path: str | None = None) -> tuple[list[dict], dict]:
    """The documents of the example with the demo's two trainer flags on its TrainingJob; returns (docs, job)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    jobs = [d for d in docs if d.get("kind") == "TrainingJob"]
    if len(jobs) != 1:
        raise DemoError(f"{path} must hold exactly one TrainingJob (found {len(jobs)})")
    job = jobs[0]
    spec = job.setdefault("spec", {})
    mount = (spec.get("checkpoint") or {}).get("mountPath", "/checkpoints")
    flags = spec.setdefault("trainer", {}).setdefault("flags", {}) or {}
    flags.setdefault("log-every", "1")
    flags.setdefault("report", report_path or f"{mount}/{REPORT_NAME}")
    spec["trainer"]["flags"] = flags
    return docs, job


def report_file(cluster: LocalCluster, namespace: str, job: dict) -> Path | None:
    """Where the trainer's report lands on this machine (the local kubelet maps a claim to a folder)."""
    spec = job.get("spec") or {}
    ck = spec.get("checkpoint") or {}
    claim = ((ck.get("volume") or {}).get("persistentVolumeClaim") or {}).get("claimName")
    report = ((spec.get("trainer") or {}).get("flags") or {}).get("report")
    mount = ck.get("mountPath", "/checkpoints")
    if not claim or not report or not report.startswith(mount + "/"):
        return None
    return cluster.dir / "pvcs" / namespace / claim / report[len(mount) + 1 :]


def read_json(path: Path | None) -> dict | None:
    try:
        return json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None


# ================================================================================================ the demo
@dataclass
class Sample:
    t: float
    step: int | None
    phase: str | None
    ready: int
    desired: int
    preemptions: int
    failures: int


@dataclass
class Observations:
    job_name: str
    applied_at: float
    samples: list[Sample] = field(default_factory=list)
    pod_seen: dict[str, float] = field(default_factory=dict)  # pod -> first time this process saw it
    notice_at: float | None = None
    preempted_node: str | None = None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ftjob demo",
        description="Run a 2-worker TrainingJob on the embedded local "
        "cluster, preempt a spot node mid-run, watch it recover, plot it.",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="cluster state folder (default: a fresh temporary folder, removed afterwards)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("demo-out"),
        help="where the plot, timeline and logs go (default ./demo-out)",
    )
    p.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    p.add_argument(
        "--manifest", type=Path, default=DEFAULT_MANIFEST, help="the job to run (default: %(default)s)"
    )
    p.add_argument("--notice", type=float, default=5.0, help="spot notice in seconds (default 5)")
    p.add_argument(
        "--replace-after",
        type=float,
        default=3.0,
        help="seconds until a fresh spot node registers (default 3)",
    )
    p.add_argument(
        "--preempt-at",
        type=float,
        default=0.3,
        help="preempt once this fraction of the steps is done (default 0.3)",
    )
    p.add_argument(
        "--spares",
        type=int,
        default=1,
        help="warm spare workers (spec.workers.spares: started, torch imported, waiting in the rendezvous; one "
        "more spot node each; default 1; 0 shows a replacement pod starting from scratch)",
    )
    p.add_argument("--timeout", type=float, default=600, help="give up after this many seconds (default 600)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if not 0 < args.preempt_at < 1:
        print(
            "ftjob demo: --preempt-at is a fraction of the steps, between 0 and 1 (e.g. 0.3)", file=sys.stderr
        )
        return 2
    if args.notice < 0 or args.replace_after < 0:
        print("ftjob demo: --notice and --replace-after take seconds >= 0", file=sys.stderr)
        return 2
    if not 0 <= args.spares <= 4:
        print("ftjob demo: --spares takes 0..4", file=sys.stderr)
        return 2
    if not args.manifest.is_file():
        print(
            f"ftjob demo: no manifest at {args.manifest}; run from an ftjob checkout or pass --manifest",
            file=sys.stderr,
        )
        return 2
    if args.state_dir is not None and (args.state_dir / "objects.sqlite").exists():
        print(
            f"ftjob demo: {args.state_dir} holds an earlier cluster's objects; pass a fresh --state-dir (or none "
            "for a temporary one)",
            file=sys.stderr,
        )
        return 2
    from rich.console import Console

    console = Console()
    temporary = args.state_dir is None
    state_dir = Path(tempfile.mkdtemp(prefix="ftjob-demo-")) if temporary else args.state_dir
    cluster = LocalCluster(state_dir)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` tears down like Ctrl-C
    code = 1
    try:
        code = run_demo(args, cluster, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        code = 130
    except (SessionError, ClusterError) as e:
        console.print(f"[red]ftjob demo: {e}[/]")
        code = 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        if args.keep:
            console.print(
                f"the cluster keeps running: export KUBECONFIG={cluster.kubeconfig}; "
                f"stop it with: ftjob local down --state-dir {cluster.dir}"
            )
        else:
            _ignore_interrupts_while(lambda: cluster.down(say=lambda *_: None))
            if temporary:
                shutil.rmtree(state_dir, ignore_errors=True)
            console.print("local cluster stopped")
    return code


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def _ignore_interrupts_while(fn) -> None:
    """Teardown must finish even if the user presses Ctrl-C again."""
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        fn()
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def run_demo(args, cluster: LocalCluster, console) -> int:
    console.rule("[bold]ftjob demo")
    spot = 2 + args.spares  # a node for each worker and each spare: a preemption takes one of them
    console.print(
        f"starting a local cluster in {cluster.dir} (1 on-demand node, {spot} spot nodes, the operator)"
    )
    cluster.up(nodes=1, spot_nodes=spot, operator=True, say=lambda m: console.print(f"  [dim]{m}[/]"))
    if not cluster.alive("operator"):
        raise DemoError(
            "the operator did not start (ftjob_operator.handlers missing or crashed); see "
            f"{cluster.log_dir / 'operator.log'}"
        )
    session = Session(cluster)
    session.install_crd()
    console.print(f"installed the TrainingJob CRD from {CRD_DIR}")
    docs, job = demo_manifests(args.manifest)
    job["spec"].setdefault("workers", {})["spares"] = args.spares
    name = job["metadata"]["name"]
    session.ns = job["metadata"].get("namespace") or "default"
    steps = int((job["spec"].get("trainer") or {}).get("steps", 100))
    session.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs, sort_keys=False))
    obs = Observations(name, time.time())
    console.print(
        f"applied {args.manifest} (TrainingJob {name}, {steps} steps, {args.spares} warm spare(s); trainer flags "
        f"{job['spec']['trainer']['flags']})"
    )
    status = watch(
        session,
        obs,
        console,
        steps=steps,
        preempt_at=max(1, int(steps * args.preempt_at)),
        spares=args.spares,
        notice=args.notice,
        replace_after=args.replace_after,
        timeout=args.timeout,
    )
    events = read_job_events(cluster.dir, session.ns, name)
    result = summarize(session, obs, status, analyze(events), report_file(cluster, session.ns, job))
    args.out.mkdir(parents=True, exist_ok=True)
    print_timeline(console, result)
    png = args.out / "demo.png"
    plot(result, png)
    (args.out / "demo.json").write_text(json.dumps(result, indent=2, default=str))
    if (cluster.dir / "logs").is_dir():
        shutil.copytree(cluster.dir / "logs", args.out / "logs", dirs_exist_ok=True)
    console.print(f"wrote {png}, {args.out / 'demo.json'} and the pod logs under {args.out / 'logs'}")
    print_goodput(console, result)
    if status.get("phase") != "Succeeded":
        cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Failed"), {})
        raise DemoError(
            f"the job ended {status.get('phase')}: {cond.get('message') or status.get('lastFailure')}"
        )
    return 0


def watch(
    session: Session,
    obs: Observations,
    console,
    *,
    steps: int,
    preempt_at: int,
    notice: float,
    replace_after: float,
    timeout: float,
    spares: int = 0,
) -> dict:
    """Live progress until the job finishes; preempts a training worker's node once `preempt_at` steps are done
    (and the warm spares are up)."""
    from rich.live import Live

    from .preempt import request_preemption

    deadline = time.monotonic() + timeout
    status: dict = {}
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while True:
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"the job did not finish within {timeout:g}s; phase {status.get('phase')}; see "
                        f"kubectl describe tj {obs.job_name} and {session.cluster.log_dir}"
                    )
                now = time.time()
                job = session.job(obs.job_name) or {}
                status = job.get("status") or {}
                for p in session.pods(obs.job_name):
                    obs.pod_seen.setdefault(p["metadata"]["name"], now)
                workers = status.get("workers") or {}
                sample = Sample(
                    now,
                    status.get("step"),
                    status.get("phase"),
                    workers.get("ready", 0),
                    workers.get("desired", 0),
                    status.get("preemptions", 0),
                    status.get("failures", 0),
                )
                obs.samples.append(sample)
                preempted = (
                    f"{obs.preempted_node} at +{obs.notice_at - obs.applied_at:.1f}s"
                    if obs.notice_at
                    else None
                )
                live.update(
                    progress_table(obs.job_name, sample, steps, status, now - obs.applied_at, preempted)
                )
                if status.get("phase") in ("Succeeded", "Failed"):
                    return status
                # The step to preempt at comes from the trainer's own step events: status.step follows the
                # operator's read of the coordinator, up to 10 s late, and a quiet machine trains 40-90 steps in
                # that time (the job then finished during the notice: no resume to show).
                trainer_events = (
                    read_job_events(session.cluster.dir, session.ns, obs.job_name)
                    if obs.notice_at is None
                    else []
                )
                trained = max(
                    [sample.step or 0] + [e["step"] for e in of(trainer_events, contract.EVENT_STEP)]
                )
                if (
                    obs.notice_at is None
                    and trained >= preempt_at
                    and sample.ready >= max(1, sample.desired)
                    and workers.get("spares", 0) >= spares
                ):
                    # a node with a training worker, never a spare's (its loss would cost training nothing)
                    training = training_pods(trainer_events)
                    node = session.node_of_worker(obs.job_name, among=training)
                    if node:
                        request_preemption(session.kube, node, notice=notice, replace_after=replace_after)
                        obs.notice_at, obs.preempted_node = time.time(), node
                        live.console.print(
                            f"[bold red]preempting {node}[/] at step {trained}: {notice:g}s notice, "
                            f"a fresh spot node registers after {replace_after:g}s"
                        )
                time.sleep(0.25)
    finally:
        console.line()  # the live table's last frame ends without a newline when the output is not a terminal


def summarize(session: Session, obs: Observations, status: dict, a: Analysis, report: Path | None) -> dict:
    """The timeline as (seconds after apply, what) rows plus the figures, JSON-ready."""
    t0 = obs.applied_at
    rows: list[tuple[float, str]] = []

    def add(t: float | None, what: str) -> None:
        if t is not None:
            rows.append((round(t - t0, 2), what))

    add(a.first_step_at, "first training step")
    if obs.notice_at:
        add(obs.notice_at, f"preemption notice for {obs.preempted_node}")
    for ev in session.events():
        inv = ev.get("involvedObject") or {}
        reason = ev.get("reason") or ""
        if inv.get("name") == obs.job_name and reason in JOB_REASONS:
            add(event_time(ev), f"operator: {reason}: {ev.get('message', '')}"[:140])
        elif inv.get("kind") == "Node" and reason in NODE_REASONS:
            add(event_time(ev), f"node {inv.get('name')}: {reason}")
    replacements = sorted(
        (t, n) for n, t in obs.pod_seen.items() if "-worker-" in n and obs.notice_at and t > obs.notice_at
    )
    for t, n in replacements:
        add(t, f"replacement worker {n} created")
    for t, step in a.requested_saves:
        add(t, f"trainer saves step {step} on the operator's checkpoint request")
    for r in a.resumes:
        add(r.t_signal, "SIGTERM reached the trainer")
        add(r.t_commit, f"stop checkpoint committed (step {r.stop_steps[-1] if r.stop_steps else '?'})")
        add(r.t_loaded, f"resumed from step {r.from_step}")
        add(r.t_first_step, f"first step after resume (step {r.from_step + 1})")
    add(a.done_at, f"done (step {a.final_step})")
    rows.sort()
    report_doc = read_json(report)
    progress = status.get("progress") or {}
    lost = progress.get("lost") or {}
    return {
        "job": obs.job_name,
        "phase": status.get("phase"),
        "preemptions": status.get("preemptions", 0),
        "failures": status.get("failures", 0),
        "final_step": a.final_step,
        "lost_steps": a.lost_steps,
        "trained_twice": a.trained_twice,
        "skipped": a.skipped,
        # The operator's figures (status.progress), and the lost time read from the trainer's events to compare.
        "goodput": progress.get("goodput"),
        "elapsed_s": progress.get("elapsedSeconds"),
        "kept_s": progress.get("keptSeconds"),
        "lost_preemptions_s": (lost.get("preemptions") or {}).get("seconds"),
        "lost_preemptions_steps": (lost.get("preemptions") or {}).get("steps"),
        "lost_failures_s": (lost.get("failures") or {}).get("seconds"),
        "lost_s_events": round(a.lost_seconds, 3),
        "state_sha256": (report_doc or {}).get("state_sha256"),
        "notice_at": round(obs.notice_at - t0, 3) if obs.notice_at else None,
        "preempted_node": obs.preempted_node,
        "resumes": [resume_json(r, t0) for r in a.resumes],
        "timeline": rows,
        "steps": [(round(t - t0, 3), s) for t, s in a.steps],
        "commits": [(round(t - t0, 3), s) for t, s in a.commits],
    }


def resume_json(r: Resume, t0: float) -> dict:
    """A resume with its times in seconds after t0 and each pod's breakdown (moment, after the signal, + since the
    moment before)."""
    doc = asdict(r)
    for k in ("t_started", "t_loaded", "t_first_step", "t_stop", "t_signal", "t_commit", "t_kept_step"):
        if doc[k] is not None:
            doc[k] = round(doc[k] - t0, 3)
    doc["lost_s"] = None if r.lost_s is None else round(r.lost_s, 3)
    for pod, rec in zip(doc["pods"], r.pods, strict=True):
        pod["moments"] = {m: None if t is None else round(t - t0, 3) for m, t in rec.moments.items()}
        pod["breakdown"] = [
            (m, None if since is None else round(since, 3), None if step is None else round(step, 3))
            for m, since, step in breakdown_rows(rec)
        ]
        pod["total_s"] = None if rec.total() is None else round(rec.total(), 3)
    return doc


if __name__ == "__main__":
    sys.exit(main())
