"""What `ftjob demo` shows: the live progress table, the timeline, the breakdown of each recovery and the plot.

Everything here reads the JSON-ready result of demo.summarize (times in seconds after `kubectl apply`).
"""

from __future__ import annotations

from pathlib import Path

from .timeline import MOMENTS


def progress_table(job_name: str, sample, steps: int, status: dict, elapsed: float, preempted: str | None):
    """One frame of the live view: a demo.Sample and the job's status."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    t = Table(title=f"TrainingJob {job_name}", show_header=False, expand=False)
    t.add_column(style="bold")
    t.add_column()
    step = sample.step or 0
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=steps, completed=step, width=40), f"{step}/{steps}")
    t.add_row("step", bar)
    t.add_row("phase", str(sample.phase or "-"))
    t.add_row("workers", f"{sample.ready}/{sample.desired} ready")
    t.add_row("preemptions", str(sample.preemptions))
    t.add_row("failures", str(sample.failures))
    ck = status.get("lastCheckpoint") or {}
    t.add_row("last checkpoint", f"step {ck['step']}" if ck.get("step") is not None else "-")
    progress = status.get("progress") or {}
    if progress.get("etaSeconds") is not None:
        t.add_row("ETA", f"{progress['etaSeconds']}s at {progress.get('stepsPerSecond') or 0:.1f} steps/s")
    if progress.get("goodput") is not None:
        lost = ((progress.get("lost") or {}).get("preemptions") or {}).get("seconds") or 0
        t.add_row("goodput", f"{progress['goodput']:.2f} ({lost:.1f}s lost to preemptions)")
    t.add_row("elapsed", f"{elapsed:.0f}s")
    if preempted:
        t.add_row("preempted", preempted)
    return t


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
        print_breakdown(console, r)
        if r["t_first_step"] is not None and r["t_signal"] is not None:
            save = f" (save {r['save_seconds']:.2f}s)" if r["save_seconds"] is not None else ""
            console.print(
                f"SIGTERM -> first step after resume: {r['t_first_step'] - r['t_signal']:.1f}s{save}"
            )


def goodput_lines(result: dict) -> list[str]:
    """The demo's last words: goodput and what the preemption cost, as the operator reports them (status.progress),
    with the trainer's own clock beside them."""
    if result.get("goodput") is None:
        return ["goodput: the operator reported no figures (status.progress is empty)"]
    lines = [
        f"goodput {result['goodput']:.2f}: {result['kept_s']:.1f}s of the {result['elapsed_s']:.1f}s the job ran "
        "trained steps that were kept (status.progress)"
    ]
    lines.append(
        f"lost to preemptions: {result['lost_preemptions_s']:.1f}s and {result['lost_preemptions_steps']} step(s) "
        f"trained twice; to failures: {result['lost_failures_s']:.1f}s "
        f"(the trainer's events: {result['lost_s_events']:.1f}s from the last kept step to the first step after "
        "each resume)"
    )
    return lines


def print_goodput(console, result: dict) -> None:
    for line in goodput_lines(result):
        console.print(line, soft_wrap=True)  # one line each, however narrow the terminal


def _cell(since: float | None, step: float | None) -> str:
    if since is None:
        return "-"
    return f"{since:.2f}" + (f" (+{step:.2f})" if step is not None else "")


def print_breakdown(console, resume: dict) -> None:
    """One row per moment of the recovery, one column per pod: seconds after the signal (+ since the moment
    before)."""
    from rich.table import Table

    pods = resume["pods"]
    if not pods:
        return
    t = Table(
        title=f"recovery to step {resume['from_step']}: seconds after the signal (+ since the row above)"
    )
    t.add_column("moment")
    for p in pods:
        t.add_column(f"{p['role']} {p['pod']}", justify="right")
    columns = [{m: (since, step) for m, since, step in p["breakdown"]} for p in pods]
    for m in MOMENTS:
        t.add_row(m.replace("_", " "), *(_cell(*col[m]) for col in columns))
    t.add_row(
        "load",
        *(
            f"{p['load_bytes'] / 1e6:.1f} MB at {p['load_gbps']:.2f} GB/s" if p["load_gbps"] else "-"
            for p in pods
        ),
    )
    console.print(t)


def plot(result: dict, path: Path) -> None:
    """Step vs time, with the preemption notice, every resume and the time it lost marked, and the goodput."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot([t for t, _ in result["steps"]], [s for _, s in result["steps"]], ".", markersize=3, label="step")
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
        if r.get("t_kept_step") is not None and r["t_first_step"] is not None:
            label = (
                f"lost: last kept step -> first step after resume ({r['lost_s']:.1f}s)" if i == 0 else None
            )
            ax.axvspan(r["t_kept_step"], r["t_first_step"], color="tab:red", alpha=0.12, label=label)
        if r["t_signal"] is not None:
            ax.axvline(r["t_signal"], color="tab:orange", linestyle=":", label="SIGTERM" if i == 0 else None)
        ax.axvline(r["t_loaded"], color="tab:green", alpha=0.7, label="checkpoint loaded" if i == 0 else None)
    ax.set_xlabel("seconds after kubectl apply")
    ax.set_ylabel("training step")
    goodput = result.get("goodput")
    cost = (
        f"goodput {goodput:.2f}, {result['lost_preemptions_s']:.1f}s lost to preemptions"
        if goodput is not None
        else "no goodput reported"
    )
    ax.set_title(
        f"TrainingJob {result['job']}: {result['preemptions']} preemption(s), {cost}, "
        f"lost steps {result['lost_steps']}",
        fontsize=10,
    )
    if goodput is not None:
        ax.text(
            0.99,
            0.03,
            f"goodput {goodput:.2f}\nkept {result['kept_s']:.1f}s of {result['elapsed_s']:.1f}s\n"
            f"lost to preemptions {result['lost_preemptions_s']:.1f}s",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8},
        )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
