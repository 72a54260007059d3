"""The demo's reading of the trainer's events (lost steps, resumes, the breakdown of a recovery per pod), its
rendering and its argument checks; fast, no cluster."""

from __future__ import annotations

import io

from ftjob_local.demo import main, resume_json
from ftjob_local.demo_render import goodput_lines, plot, print_goodput, print_timeline
from ftjob_local.timeline import MOMENTS, analyze, breakdown_rows, pod_events
from ftjob_trainer import contract
from rich.console import Console

T0 = 1_800_000_000.0  # unix seconds; the events carry absolute times


class Proc:
    """One trainer process's event lines, as its pod's log holds them."""

    def __init__(self, pod: str, pid: int, rank: int):
        self.pod, self.pid, self.rank, self.lines = pod, pid, rank, []

    def ev(self, name: str, t: float, **fields) -> Proc:
        self.lines.append(contract.event_line(name, time=T0 + t, rank=self.rank, pid=self.pid, **fields))
        return self

    def start(self, t: float, *, loaded: int | None = None, bytes_: int = 4_000_000) -> Proc:
        """Started at t (imports done 2 s later), process group, model, then a load of step `loaded` or fresh."""
        self.ev(contract.EVENT_PROCESS_STARTED, t + 2.0, started_at=T0 + t, restart_count=0)
        self.ev(contract.EVENT_PROCESS_GROUP_READY, t + 3.0, backend="gloo", world_size=2, seconds=0.9)
        self.ev(contract.EVENT_MODEL_BUILT, t + 3.5, model="tiny", params=1000, seconds=0.5)
        if loaded is None:
            return self.ev(contract.EVENT_FRESH_START, t + 3.6)
        return self.ev(
            contract.EVENT_CHECKPOINT_LOADED, t + 4.0, step=loaded, bytes=bytes_, seconds=0.4, gbps=0.01
        )

    def steps(self, first: int, last: int, t: float) -> Proc:
        self.ev(contract.EVENT_FIRST_STEP, t, step=first, seconds=5.0)
        for i, s in enumerate(range(first, last + 1)):
            if self.rank == 0:
                self.ev(contract.EVENT_STEP, t + 0.5 * i, step=s, loss=8.0, tokens_per_s=900.0)
        return self


def log_events(*procs: Proc) -> list[dict]:
    """The events of the processes' pods' logs, with the lines the parser must skip (torchrun's, plain log text)."""
    by_pod: dict[str, list[str]] = {}
    for p in procs:
        by_pod.setdefault(p.pod, []).extend(
            [
                "[W1202 10:00:00] torchrun noise",
                "2026-12-02 10:00:00,000 rank0 INFO ftjob.train: step 99 loss 1",
            ]
            + [
                f"[default0]:{line}" for line in p.lines
            ]  # torchrun's --tee prefix: found anywhere in the line
        )
    return sorted(
        (ev for pod, lines in by_pod.items() for ev in pod_events("\n".join(lines), pod)),
        key=lambda e: e["time"],
    )


def notice_preemption() -> list[dict]:
    """Round 1: w-0 (rank 0) and w-1 train 1..12; w-1 is signalled, both stop at 12 with a save. Round 2: torchrun
    restarts w-0's trainer (a survivor), the replacement w-2 joins; both load 12 and train 13..20."""
    a0 = Proc("w-0", 10, 0).start(0).steps(1, 12, 4.0)
    a0.ev(
        contract.EVENT_CHECKPOINT_COMMITTED,
        9.0,
        step=10,
        path="/c/step-10",
        bytes=8,
        seconds=0.3,
        kind="periodic",
    )
    a1 = Proc("w-1", 11, 1).start(0).steps(1, 12, 4.0)
    a1.ev(contract.EVENT_STOP_SIGNAL, 10.1, signal="SIGTERM", signal_time=T0 + 10.0, step=12)
    a0.ev(contract.EVENT_STOP_AGREED, 10.2, step=12, reason=contract.REASON_PEER)
    a0.ev(
        contract.EVENT_CHECKPOINT_COMMITTED,
        10.45,
        step=12,
        path="/c/step-12",
        bytes=8,
        seconds=0.2,
        kind="stop",
    )
    a1.ev(contract.EVENT_EXIT, 10.6, code=75, reason=contract.REASON_PREEMPTED, message="stopped", step=12)
    a0.ev(contract.EVENT_EXIT, 10.7, code=75, reason=contract.REASON_PEER, message="stopped", step=12)
    b0 = Proc("w-0", 20, 0).start(12.0, loaded=12).steps(13, 20, 16.5)
    b0.ev(contract.EVENT_EXIT, 21.0, code=0, reason=contract.REASON_DONE, message="done", step=20)
    b1 = Proc("w-2", 30, 1).start(12.01, loaded=12).steps(13, 20, 16.49)
    return log_events(a0, a1, b0, b1)


def test_notice_preemption_loses_nothing_and_breaks_down_per_pod():
    a = analyze(notice_preemption())
    assert (a.final_step, a.trained_twice, a.skipped, a.lost_steps) == (20, 0, 0, 0)
    assert a.done_at == T0 + 21.0 and [s for _, s in a.commits] == [10, 12]
    (r,) = a.resumes
    assert (r.from_step, r.stop_steps, r.stop_reasons) == (12, [12], ["peer-stopped", "preempted"])
    assert (r.t_signal, r.t_commit, r.t_stop) == (T0 + 10.0, T0 + 10.45, T0 + 10.7)
    assert abs(r.save_seconds - 0.45) < 1e-6 and r.t_first_step > r.t_loaded > r.t_started
    assert r.world_size_pods == 2
    # Lost: from step 12's report (+9.5) to the first step after the resume (+16.5).
    assert (r.t_kept_step, r.lost_s, a.lost_seconds) == (T0 + 9.5, 7.0, 7.0)
    survivor, replacement = r.pod("survivor"), r.pod("replacement")
    assert (survivor.pod, survivor.replaces, replacement.pod, replacement.replaces) == (
        "w-0",
        [],
        "w-2",
        ["w-1"],
    )
    assert survivor.moments["exited"] == T0 + 10.7  # its own old process
    assert replacement.moments["exited"] == T0 + 10.6  # the process of the pod it replaces
    for rec in (survivor, replacement):
        times = [rec.moments[m] for m in MOMENTS]
        assert None not in times and times == sorted(times), rec.moments
        assert (rec.load_bytes, rec.load_seconds) == (4_000_000, 0.4) and abs(rec.load_gbps - 0.01) < 1e-9
    rows = breakdown_rows(survivor)
    assert [m for m, _, _ in rows] == list(MOMENTS)
    assert rows[0][1:] == (0.0, None) and abs(rows[-1][1] - 6.5) < 1e-6 and abs(survivor.total() - 6.5) < 1e-6


def test_demo_prints_the_breakdown_and_the_signal_to_first_step_line():
    a = analyze(notice_preemption())
    result = {
        "timeline": [(1.0, "first training step")],
        "phase": "Succeeded",
        "final_step": a.final_step,
        "preemptions": 1,
        "failures": 0,
        "lost_steps": 0,
        "trained_twice": 0,
        "skipped": 0,
        "resumes": [resume_json(r, T0) for r in a.resumes],
    }
    doc = result["resumes"][0]
    assert doc["t_signal"] == 10.0 and [p["role"] for p in doc["pods"]] == ["survivor", "replacement"]
    assert doc["pods"][0]["breakdown"][-1][0] == "first_step" and doc["pods"][0]["total_s"] == 6.5
    out = io.StringIO()
    print_timeline(Console(file=out, width=160), result)
    text = out.getvalue()
    for part in ("survivor w-0", "replacement w-2", "process group ready", "checkpoint loaded", "4.0 MB at"):
        assert part in text, text
    assert "SIGTERM -> first step after resume: 6.5s (save 0.45s)" in text, text


def _result() -> dict:
    a = analyze(notice_preemption())
    return {
        "job": "local-tiny",
        "timeline": [(1.0, "first training step")],
        "phase": "Succeeded",
        "final_step": a.final_step,
        "preemptions": 1,
        "failures": 0,
        "lost_steps": 0,
        "trained_twice": 0,
        "skipped": 0,
        "notice_at": 9.0,
        "resumes": [resume_json(r, T0) for r in a.resumes],
        "steps": [(round(t - T0, 3), s) for t, s in a.steps],
        "commits": [(round(t - T0, 3), s) for t, s in a.commits],
        "goodput": 0.6123,
        "elapsed_s": 21.0,
        "kept_s": 12.858,
        "lost_preemptions_s": 7.0,
        "lost_preemptions_steps": 0,
        "lost_failures_s": 0,
        "lost_s_events": round(a.lost_seconds, 3),
    }


def test_the_demo_ends_with_goodput_and_what_the_preemption_cost_and_plots_them(tmp_path):
    result = _result()
    assert (result["resumes"][0]["t_kept_step"], result["resumes"][0]["lost_s"]) == (9.5, 7.0)
    out = io.StringIO()
    print_goodput(Console(file=out, width=200), result)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("goodput 0.61: 12.9s of the 21.0s the job ran trained steps that were kept"), (
        lines
    )
    assert lines[1].startswith("lost to preemptions: 7.0s and 0 step(s) trained twice; to failures: 0.0s"), (
        lines
    )
    assert "the trainer's events: 7.0s" in lines[1]
    assert goodput_lines({"goodput": None}) == [
        "goodput: the operator reported no figures (status.progress is empty)"
    ]
    png = tmp_path / "demo.png"
    plot(result, png)
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 10_000


def test_hard_kill_counts_steps_trained_twice():
    a0 = Proc("w-0", 10, 0).start(0).steps(1, 14, 4.0)
    a0.ev(
        contract.EVENT_CHECKPOINT_COMMITTED,
        9.0,
        step=10,
        path="/c/step-10",
        bytes=8,
        seconds=0.3,
        kind="periodic",
    )
    b0 = Proc("w-2", 20, 0).start(30.0, loaded=10).steps(11, 20, 35.0)
    a = analyze(log_events(a0, b0))
    assert (a.final_step, a.trained_twice, a.skipped, a.lost_steps) == (20, 4, 0, 4)
    (r,) = a.resumes
    assert (r.from_step, r.stop_steps, r.t_signal, r.t_commit, r.save_seconds) == (10, [], None, None, None)
    (rec,) = r.pods
    assert (rec.role, rec.replaces, rec.moments["signal"], rec.moments["exited"]) == (
        "replacement",
        ["w-0"],
        None,
        None,
    )
    assert rec.total() is None and rec.moments["first_step"] == T0 + 35.0
    # Lost: from the loaded step 10 (+8.5), through the steps trained again, to the first step after (+35).
    assert (r.t_kept_step, r.lost_s) == (T0 + 8.5, 26.5)


def test_a_pod_is_as_ready_as_its_slowest_process():
    a0, a1 = Proc("w-0", 10, 0).start(0), Proc("w-0", 11, 1).start(0)
    a0.steps(1, 4, 4.0).ev(contract.EVENT_EXIT, 6.0, code=75, reason="preempted", message="", step=4)
    a1.steps(1, 4, 4.0).ev(contract.EVENT_EXIT, 6.2, code=75, reason="preempted", message="", step=4)
    b0 = Proc("w-0", 20, 0).start(10.0, loaded=4).steps(5, 8, 15.0)
    b1 = Proc("w-0", 21, 1).start(10.3, loaded=4, bytes_=1000).steps(5, 8, 15.0)
    (r,) = analyze(log_events(a0, a1, b0, b1)).resumes
    (rec,) = r.pods
    assert rec.role == "survivor" and rec.moments["exited"] == T0 + 6.2
    assert rec.moments["process_started"] == T0 + 10.3 and rec.moments["checkpoint_loaded"] == T0 + 14.3
    assert rec.load_bytes == 4_001_000


def test_missing_steps_are_counted_as_skipped_and_a_fresh_start_is_no_resume():
    p = Proc("w", 1, 0).start(0)
    for s in (1, 2, 5):
        p.ev(contract.EVENT_STEP, s, step=s, loss=1.0, tokens_per_s=1.0)
    a = analyze(log_events(p))
    assert (a.final_step, a.skipped, a.trained_twice, a.resumes) == (5, 2, 0, [])


def test_bad_arguments_say_what_to_fix(tmp_path, capsys):
    assert main(["--preempt-at", "2"]) == 2
    assert "--preempt-at is a fraction" in capsys.readouterr().err
    assert main(["--notice", "-1"]) == 2
    assert "seconds >= 0" in capsys.readouterr().err
    assert main(["--manifest", str(tmp_path / "missing.yaml")]) == 2
    assert "no manifest at" in capsys.readouterr().err
