"""`ftjob demo`: watch a TrainingJob survive a spot preemption on the embedded local cluster.

In order: start a local cluster (an on-demand node for the coordinator, two spot nodes for the workers, the
operator), install the CRD with kubectl, apply examples/local-tiny.yaml, preempt the node of a worker mid-run
with notice (a fresh spot node comes back after --replace-after), show live progress, wait for Succeeded, then
print a timeline and write a PNG of step vs time. The cluster is torn down on every path, Ctrl-C included,
unless --keep.

The timeline is read from what the parts record anyway: the trainer's rank-0 log lines (`step N`, `checkpoint
step N committed`, `resumed from ... (step N`, `exit 75 (...)`), the pods' creation times, and the job's status
and events. The demo only adds two trainer flags to the job it applies: `log-every: 1` (one log line per step,
so steps trained twice or skipped can be counted exactly) and `report` (the trainer's JSON report on the
checkpoint volume). The same functions serve the end-to-end tests and bench/local_recovery.py.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import yaml
from ftjob_trainer.contract import parse_time

from .client import ApiError, Kube
from .cluster import ClusterError, LocalCluster

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MANIFEST = REPO / "examples" / "local-tiny.yaml"
CRD_DIR = REPO / "crds"
GROUP_PATH = "/apis/ftjob.dev/v1alpha1"
WORKER_CONTAINER = (
    "trainer"  # render.WORKER_CONTAINER (the operator's; not imported: ftjob_local needs no operator)
)
REPORT_NAME = "demo-report.json"

# --- the trainer's log lines (ftjob_trainer.train / .checkpoint, logging format "%(asctime)s rank%d LEVEL name: msg")
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank(\d+) (\w+) ([\w.]+): (.*)$")
STEP = re.compile(r"^step (\d+) loss")
COMMITTED = re.compile(r"^checkpoint step (\d+) committed at (\S+) in ([\d.]+)s")
RESUMED = re.compile(r"^resumed from (\S+) \(step (\d+)")
REQUESTED = re.compile(r"^saving step (\d+) for coordinator request")
EXIT = re.compile(r"^exit (\d+) \(([\w-]+)\): (.*)$")
STOPPED_AT = re.compile(r"stopped at step (\d+)")
AFTER_SIGNAL = re.compile(r"\(([\d.]+)s after the signal\)")


class DemoError(Exception):
    """The demo cannot go on; the message says why and what to look at."""


# ================================================================================================ log analysis
@dataclass(frozen=True)
class LogRecord:
    t: float  # seconds since the epoch
    pod: str
    rank: int
    kind: str  # config | sharded | step | requested | committed | resumed | exit
    step: int | None = None
    text: str = ""
    exit_code: int | None = None
    reason: str | None = None


def parse_trainer_log(text: str, pod: str) -> list[LogRecord]:
    """The records that matter for the timeline, from one worker container's log (all its torchrun restarts)."""
    out: list[LogRecord] = []
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        if not m:
            continue  # torchrun's own lines, tracebacks
        stamp, rank, _level, logger, msg = m.groups()
        # The trainer logs with the pod's local time, as this process reads it (same machine).
        t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        r = int(rank)
        if logger == "ftjob.train" and msg.startswith("config: "):
            out.append(LogRecord(t, pod, r, "config"))
        elif logger.endswith("parallelize") and msg.startswith("FSDP2:"):
            out.append(LogRecord(t, pod, r, "sharded"))  # the model is built and sharded; loading comes next
        elif logger == "ftjob.train" and (s := STEP.match(msg)):
            out.append(LogRecord(t, pod, r, "step", int(s.group(1))))
        elif (c := COMMITTED.match(msg)) and logger.endswith("checkpoint"):
            out.append(LogRecord(t, pod, r, "committed", int(c.group(1)), msg))
        elif (c := RESUMED.match(msg)) and logger.endswith("checkpoint"):
            out.append(LogRecord(t, pod, r, "resumed", int(c.group(2)), msg))
        elif logger == "ftjob.train" and (q := REQUESTED.match(msg)):
            out.append(LogRecord(t, pod, r, "requested", int(q.group(1)), msg))
        elif logger == "ftjob.train" and (e := EXIT.match(msg)):
            stopped = STOPPED_AT.search(e.group(3))
            out.append(
                LogRecord(
                    t,
                    pod,
                    r,
                    "exit",
                    int(stopped.group(1)) if stopped else None,
                    e.group(3),
                    int(e.group(1)),
                    e.group(2),
                )
            )
    return out


def read_job_logs(state_dir: Path, namespace: str, job: str) -> list[LogRecord]:
    """Every worker pod's trainer log the local kubelet wrote (they stay after the pods are deleted)."""
    records: list[LogRecord] = []
    root = Path(state_dir) / "logs" / namespace
    for pod_dir in sorted(root.glob(f"{job}-worker-*")):
        for name in (f"{WORKER_CONTAINER}.previous.log", f"{WORKER_CONTAINER}.log"):
            f = pod_dir / name
            if f.exists():
                records += parse_trainer_log(f.read_text(errors="replace"), pod_dir.name)
    return sorted(records, key=lambda r: r.t)


@dataclass
class Resume:
    """One restart of training: who stopped, at which step, what was saved, when training went on."""

    from_step: int  # the checkpoint step it loaded
    t_config: float  # rank 0 of the new round started (after the rendezvous)
    t_sharded: float | None  # its model was built and sharded (the checkpoint load starts)
    t_resumed: float  # the checkpoint was loaded
    t_first_step: float | None  # the first step after the load
    world_size_pods: int  # pods with a rank in the new round
    stop_steps: list[int] = field(
        default_factory=list
    )  # steps the ranks stopped at (exit 75), before this resume
    stop_reasons: list[str] = field(default_factory=list)
    t_stop: float | None = None  # the last rank's exit line before this resume
    t_signal: float | None = None  # SIGTERM as the preempted rank measured it (save deadline clock)
    save_seconds: float | None = None  # signal -> committed, as the trainer measured it
    t_commit: float | None = None  # rank 0's commit of the stop checkpoint


@dataclass
class Analysis:
    steps: list[tuple[float, int]]  # (time, step) of every rank-0 step line, in time order
    final_step: int
    trained_twice: int  # steps a rank 0 logged more than once
    skipped: int  # steps 1..final never logged
    resumes: list[Resume]
    done_at: float | None
    first_step_at: float | None
    commits: list[tuple[float, int]]  # rank 0's committed checkpoints
    requested_saves: list[
        tuple[float, int]
    ]  # saves rank 0 started for a coordinator request (notice, annotation)

    @property
    def lost_steps(self) -> int:
        return self.trained_twice + self.skipped


def analyze(records: list[LogRecord]) -> Analysis:
    """Steps, resumes and lost steps from the parsed logs (needs the trainer's --log-every 1 to be exact)."""
    rank0 = [r for r in records if r.rank == 0]
    steps = [(r.t, r.step) for r in rank0 if r.kind == "step"]
    counts = Counter(s for _, s in steps)
    final = max(counts, default=0)
    resumes: list[Resume] = []
    configs = [r for r in rank0 if r.kind == "config"]
    for res in (r for r in rank0 if r.kind == "resumed"):
        config = max((c for c in configs if c.t <= res.t), key=lambda c: c.t, default=None)
        t_config = config.t if config else res.t
        first = next((t for t, _ in steps if t > res.t), None)
        previous = resumes[-1].t_resumed if resumes else float("-inf")
        # Stops between the previous resume and this round's start belong to this restart.
        stops = [r for r in records if r.kind == "exit" and r.exit_code != 0 and previous < r.t <= t_config]
        # Pods whose rank>=0 lines show up between this round's start and its first step.
        until = first if first is not None else res.t
        pods = {r.pod for r in records if r.kind == "config" and t_config - 5 <= r.t <= until}
        sharded = max((r.t for r in rank0 if r.kind == "sharded" and t_config <= r.t <= res.t), default=None)
        resume = Resume(
            res.step,
            t_config,
            sharded,
            res.t,
            first,
            len(pods),
            sorted({s.step for s in stops if s.step is not None}),
            sorted({s.reason or "" for s in stops}),
        )
        if stops:
            resume.t_stop = max(s.t for s in stops)
        for s in stops:
            after = AFTER_SIGNAL.search(s.text)
            if after and s.reason == "preempted":
                resume.t_signal = s.t - float(after.group(1))  # the exit line follows the commit closely
                resume.save_seconds = float(after.group(1))
        commit = [
            r
            for r in rank0
            if r.kind == "committed" and previous < r.t <= t_config and r.step in resume.stop_steps
        ]
        if commit:
            resume.t_commit = commit[-1].t
        resumes.append(resume)
    done = next((r.t for r in rank0 if r.kind == "exit" and r.exit_code == 0), None)
    return Analysis(
        steps=steps,
        final_step=final,
        trained_twice=sum(c - 1 for c in counts.values()),
        skipped=len(set(range(1, final + 1)) - set(counts)),
        resumes=resumes,
        done_at=done,
        first_step_at=steps[0][0] if steps else None,
        commits=[(r.t, r.step) for r in rank0 if r.kind == "committed"],
        requested_saves=[(r.t, r.step) for r in rank0 if r.kind == "requested"],
    )


# ================================================================================================ the cluster side
def find_kubectl() -> str:
    here = Path(sys.executable).parent / "kubectl"
    found = str(here) if here.exists() else shutil.which("kubectl")
    if not found:
        raise DemoError(
            "kubectl not found next to this Python or on PATH; run ./dev setup (it installs kubectl "
            "into .venv/bin)"
        )
    return found


class Session:
    """A kubeconfig, kubectl and the API of one local cluster, with the calls the demo, tests and benches share."""

    def __init__(self, cluster: LocalCluster, namespace: str = "default"):
        self.cluster = cluster
        self.ns = namespace
        self.kube = Kube(str(cluster.kubeconfig))
        self.kubectl_bin = find_kubectl()

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        env = {
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "PATH": str(Path(self.kubectl_bin).parent),
            "HOME": str(self.cluster.dir),
        }
        p = subprocess.run(
            [self.kubectl_bin, *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and p.returncode != 0:
            raise DemoError(
                f"kubectl {' '.join(args)} failed ({p.returncode}): {p.stderr.strip() or p.stdout}"
            )
        return p

    def install_crd(self, timeout: float = 30) -> None:
        self.kubectl("apply", "-f", str(CRD_DIR))
        deadline = time.monotonic() + timeout
        while True:  # served once the API server has picked the CRD up
            try:
                self.kube.request("GET", f"{GROUP_PATH}/trainingjobs")
                return
            except ApiError as e:
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"the TrainingJob resource was not served {timeout:g}s after applying {CRD_DIR}: {e}"
                    ) from None
            time.sleep(0.2)

    def job_path(self, name: str) -> str:
        return f"{GROUP_PATH}/namespaces/{self.ns}/trainingjobs/{name}"

    def job(self, name: str) -> dict | None:
        return self.kube.get(self.job_path(name))

    def pods(self, job: str) -> list[dict]:
        q = {"labelSelector": f"ftjob.dev/job-name={job}"}
        return self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/pods", query=q).get("items") or []

    def events(self) -> list[dict]:
        return self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/events").get("items") or []

    def node_of_worker(self, job: str) -> str | None:
        """The node of the oldest running worker (a spot node in the examples)."""
        running = [
            p
            for p in self.pods(job)
            if (p["metadata"].get("labels") or {}).get("ftjob.dev/role") == "worker"
            and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        running.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
        return running[0]["spec"].get("nodeName") if running else None


def event_time(ev: dict) -> float | None:
    for key in ("eventTime", "lastTimestamp", "firstTimestamp"):
        t = parse_time(ev.get(key))
        if t is not None:
            return t.timestamp()
    t = parse_time((ev.get("metadata") or {}).get("creationTimestamp"))
    return t.timestamp() if t is not None else None


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
    except (DemoError, ClusterError) as e:
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
    console.print(f"starting a local cluster in {cluster.dir} (1 on-demand node, 2 spot nodes, the operator)")
    cluster.up(nodes=1, spot_nodes=2, operator=True, say=lambda m: console.print(f"  [dim]{m}[/]"))
    if not cluster.alive("operator"):
        raise DemoError(
            "the operator did not start (ftjob_operator.handlers missing or crashed); see "
            f"{cluster.log_dir / 'operator.log'}"
        )
    session = Session(cluster)
    session.install_crd()
    console.print(f"installed the TrainingJob CRD from {CRD_DIR}")
    docs, job = demo_manifests(args.manifest)
    name = job["metadata"]["name"]
    session.ns = job["metadata"].get("namespace") or "default"
    steps = int((job["spec"].get("trainer") or {}).get("steps", 100))
    session.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs, sort_keys=False))
    obs = Observations(name, time.time())
    console.print(
        f"applied {args.manifest} (TrainingJob {name}, {steps} steps; trainer flags "
        f"{job['spec']['trainer']['flags']})"
    )
    status = watch(
        session,
        obs,
        console,
        steps=steps,
        preempt_at=max(1, int(steps * args.preempt_at)),
        notice=args.notice,
        replace_after=args.replace_after,
        timeout=args.timeout,
    )
    records = read_job_logs(cluster.dir, session.ns, name)
    result = summarize(session, obs, status, analyze(records), report_file(cluster, session.ns, job))
    args.out.mkdir(parents=True, exist_ok=True)
    print_timeline(console, result)
    png = args.out / "demo.png"
    plot(result, png)
    (args.out / "demo.json").write_text(json.dumps(result, indent=2, default=str))
    if (cluster.dir / "logs").is_dir():
        shutil.copytree(cluster.dir / "logs", args.out / "logs", dirs_exist_ok=True)
    console.print(f"wrote {png}, {args.out / 'demo.json'} and the pod logs under {args.out / 'logs'}")
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
) -> dict:
    """Live progress until the job finishes; preempts a worker's node once `preempt_at` steps are done."""
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
                live.update(progress_table(obs, sample, steps, status))
                if status.get("phase") in ("Succeeded", "Failed"):
                    return status
                if (
                    obs.notice_at is None
                    and (sample.step or 0) >= preempt_at
                    and sample.ready >= max(1, sample.desired)
                ):
                    node = session.node_of_worker(obs.job_name)
                    if node:
                        request_preemption(session.kube, node, notice=notice, replace_after=replace_after)
                        obs.notice_at, obs.preempted_node = time.time(), node
                        live.console.print(
                            f"[bold red]preempting {node}[/] at step {sample.step}: {notice:g}s notice, "
                            f"a fresh spot node registers after {replace_after:g}s"
                        )
                time.sleep(0.25)
    finally:
        console.line()  # the live table's last frame ends without a newline when the output is not a terminal


def progress_table(obs: Observations, s: Sample, steps: int, status: dict):
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    t = Table(title=f"TrainingJob {obs.job_name}", show_header=False, expand=False)
    t.add_column(style="bold")
    t.add_column()
    step = s.step or 0
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=steps, completed=step, width=40), f"{step}/{steps}")
    t.add_row("step", bar)
    t.add_row("phase", str(s.phase or "-"))
    t.add_row("workers", f"{s.ready}/{s.desired} ready")
    t.add_row("preemptions", str(s.preemptions))
    t.add_row("failures", str(s.failures))
    ck = status.get("lastCheckpoint") or {}
    t.add_row("last checkpoint", f"step {ck['step']}" if ck.get("step") is not None else "-")
    t.add_row("elapsed", f"{time.time() - obs.applied_at:.0f}s")
    if obs.notice_at:
        t.add_row("preempted", f"{obs.preempted_node} at +{obs.notice_at - obs.applied_at:.1f}s")
    return t


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
        if inv.get("name") == obs.job_name and reason in (
            "TerminationNotice",
            "Preempted",
            "Replaced",
            "Recovered",
            "WorkerFailed",
            "RestartBackoff",
            "Restarted",
            "Succeeded",
            "BackoffLimitExceeded",
        ):
            add(event_time(ev), f"operator: {reason}: {ev.get('message', '')}"[:140])
        elif inv.get("kind") == "Node" and reason in ("SpotInterruption", "NodeTerminated"):
            add(event_time(ev), f"node {inv.get('name')}: {reason}")
    replacements = sorted(
        (t, n) for n, t in obs.pod_seen.items() if "-worker-" in n and obs.notice_at and t > obs.notice_at
    )
    for t, n in replacements:
        add(t, f"replacement worker {n} created")
    for t, step in a.requested_saves:
        add(t, f"trainer saves step {step} on the operator's checkpoint request")
    for r in a.resumes:
        if r.t_signal is not None:
            add(r.t_signal, "SIGTERM reached the trainer")
        if r.t_commit is not None:
            add(r.t_commit, f"stop checkpoint committed (step {r.stop_steps[-1] if r.stop_steps else '?'})")
        add(r.t_resumed, f"resumed from step {r.from_step}")
        add(r.t_first_step, f"first step after resume (step {r.from_step + 1})")
    add(a.done_at, f"done (step {a.final_step})")
    rows.sort()
    report_doc = read_json(report)
    resumes = [asdict(r) for r in a.resumes]
    for r in resumes:
        for k in ("t_config", "t_sharded", "t_resumed", "t_first_step", "t_stop", "t_signal", "t_commit"):
            if r.get(k) is not None:
                r[k] = round(r[k] - t0, 3)
    return {
        "job": obs.job_name,
        "phase": status.get("phase"),
        "preemptions": status.get("preemptions", 0),
        "failures": status.get("failures", 0),
        "final_step": a.final_step,
        "lost_steps": a.lost_steps,
        "trained_twice": a.trained_twice,
        "skipped": a.skipped,
        "state_sha256": (report_doc or {}).get("state_sha256"),
        "notice_at": round(obs.notice_at - t0, 3) if obs.notice_at else None,
        "preempted_node": obs.preempted_node,
        "resumes": resumes,
        "timeline": rows,
        "steps": [(round(t - t0, 3), s) for t, s in a.steps],
        "commits": [(round(t - t0, 3), s) for t, s in a.commits],
    }


def print_timeline(console, result: dict) -> None:
    from rich.table import Table

    t = Table(title="timeline (seconds after kubectl apply)")
    t.add_column("t", justify="right")
    t.add_column("what")
    for when, what in result["timeline"]:
        t.add_row(f"{when:.1f}", what)
    console.print(t)
    console.print(
        f"job {result['phase']}: {result['final_step']} steps, {result['preemptions']} preemption(s), "
        f"{result['failures']} failure(s), lost steps {result['lost_steps']} "
        f"(trained twice {result['trained_twice']}, skipped {result['skipped']})"
    )
    for r in result["resumes"]:
        if r["t_first_step"] is not None and result["notice_at"] is not None and r["t_signal"] is not None:
            console.print(
                f"SIGTERM -> first step after resume: {r['t_first_step'] - r['t_signal']:.1f}s "
                f"(save {r['save_seconds']:.2f}s)"
            )


def plot(result: dict, path: Path) -> None:
    """Step vs time, with the preemption notice and every resume marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = [t for t, _ in result["steps"]]
    ys = [s for _, s in result["steps"]]
    ax.plot(xs, ys, ".", markersize=3, label="rank 0 step")
    if result["commits"]:
        ax.plot(
            [t for t, _ in result["commits"]],
            [s for _, s in result["commits"]],
            "s",
            markersize=4,
            color="tab:gray",
            label="checkpoint committed",
        )
    if result["notice_at"] is not None:
        ax.axvline(result["notice_at"], color="tab:red", linestyle="--", label="preemption notice")
    for i, r in enumerate(result["resumes"]):
        if r["t_signal"] is not None:
            ax.axvline(r["t_signal"], color="tab:orange", linestyle=":", label="SIGTERM" if i == 0 else None)
        ax.axvline(
            r["t_resumed"], color="tab:green", linestyle="-", alpha=0.7, label="resumed" if i == 0 else None
        )
    ax.set_xlabel("seconds after kubectl apply")
    ax.set_ylabel("training step")
    ax.set_title(
        f"TrainingJob {result['job']}: {result['preemptions']} preemption(s), "
        f"lost steps {result['lost_steps']}"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
