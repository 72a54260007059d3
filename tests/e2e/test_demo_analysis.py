"""The demo's reading of trainer logs (lost steps, resumes) and its argument checks; fast, no cluster."""

from __future__ import annotations

from datetime import datetime, timedelta

from ftjob_local.demo import analyze, main, parse_trainer_log

T0 = datetime(2026, 12, 2, 10, 0, 0)


def lines(rank: int, start: float, entries: list[tuple[float, str]]) -> str:
    """Trainer log lines in the trainer's own format, `start` + dt seconds after 2026-12-02 10:00."""
    out = []
    for dt, msg in entries:
        t = T0 + timedelta(seconds=start + dt)
        logger = "ftjob_trainer.checkpoint" if msg.startswith(("checkpoint", "resumed")) else "ftjob.train"
        out.append(f"{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d} rank{rank} INFO {logger}: {msg}")
    out.append("[W1202 10:00:00] torchrun noise that is not a trainer line")
    return "\n".join(out)


def run(rank: int, first: int, last: int, t0: float) -> list[tuple[float, str]]:
    return [(0.0, "config: {...}")] + [
        (1 + 0.5 * (s - first), f"step {s} loss 8.1 tokens/s 900") for s in range(first, last + 1)
    ]


def test_notice_preemption_loses_nothing():
    # Incarnation 1 trains 1..12 and both ranks stop at 12 with a save; incarnation 2 resumes from 12.
    a0 = run(0, 1, 12, 0) + [
        (7.0, "checkpoint step 12 committed at /c/step-000000012 in 0.30s"),
        (
            7.1,
            "exit 75 (preempted): stopped at step 12 on signal 15; saved /c/step-000000012 in "
            "0.30s (0.45s after the signal)",
        ),
    ]
    a1 = [(7.1, "exit 75 (peer-stopped): stopped at step 12 on a peer's stop; saved /c in 0.3s (on request)")]
    b0 = (
        [(0.0, "config: {...}"), (1.0, "resumed from /c/step-000000012 (step 12, saved at world size 2)")]
        + [(1.5 + 0.5 * i, f"step {s} loss 8.0 tokens/s 900") for i, s in enumerate(range(13, 21))]
        + [(6.0, "exit 0 (done): finished all 20 steps")]
    )
    text_a, text_b = lines(0, 0, a0) + "\n" + lines(1, 0, a1), lines(0, 20, b0)
    a = analyze(
        sorted(parse_trainer_log(text_a, "w-0") + parse_trainer_log(text_b, "w-2"), key=lambda r: r.t)
    )
    assert (a.final_step, a.trained_twice, a.skipped, a.lost_steps) == (20, 0, 0, 0)
    (r,) = a.resumes
    assert (r.from_step, r.stop_steps, r.stop_reasons) == (12, [12], ["peer-stopped", "preempted"])
    assert r.save_seconds == 0.45 and r.t_commit is not None and r.t_first_step > r.t_resumed > r.t_config
    assert a.done_at is not None


def test_hard_kill_counts_steps_trained_twice():
    a0 = run(0, 1, 14, 0) + [(6.0, "checkpoint step 10 committed at /c/step-000000010 in 0.30s")]
    b0 = [
        (0.0, "config: {...}"),
        (1.0, "resumed from /c/step-000000010 (step 10, saved at world size 2)"),
    ] + [(1.5 + 0.5 * i, f"step {s} loss 8.0 tokens/s 900") for i, s in enumerate(range(11, 21))]
    a = analyze(
        sorted(
            parse_trainer_log(lines(0, 0, a0), "w-0") + parse_trainer_log(lines(0, 30, b0), "w-2"),
            key=lambda r: r.t,
        )
    )
    assert (a.final_step, a.trained_twice, a.skipped, a.lost_steps) == (20, 4, 0, 4)
    assert a.resumes[0].from_step == 10 and a.resumes[0].stop_steps == [] and a.resumes[0].t_signal is None


def test_missing_steps_are_counted_as_skipped():
    a = analyze(
        parse_trainer_log(
            lines(0, 0, [(1, "step 1 loss 1"), (2, "step 2 loss 1"), (3, "step 5 loss 1")]), "w"
        )
    )
    assert (a.final_step, a.skipped, a.trained_twice) == (5, 2, 0)


def test_bad_arguments_say_what_to_fix(tmp_path, capsys):
    assert main(["--preempt-at", "2"]) == 2
    assert "--preempt-at is a fraction" in capsys.readouterr().err
    assert main(["--notice", "-1"]) == 2
    assert "seconds >= 0" in capsys.readouterr().err
    assert main(["--manifest", str(tmp_path / "missing.yaml")]) == 2
    assert "no manifest at" in capsys.readouterr().err
