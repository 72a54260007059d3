"""Arms of bench/local_recovery.py side by side: each arm is a set of its options (pod environment, warm spares), the
arms run one after the other, alternating, --rounds times, on the same machine in the same hour, so a machine
shared with other work loads every arm alike; the table gives each arm's median over all its preemptions.

    .venv/bin/python bench/local_recovery_arms.py --rounds 2 \\
        --arm "torchrun=--env FTJOB_WARM_WORKERS=0 --env FTJOB_LEAVE_RENDEZVOUS=0 --env FTJOB_RENDEZVOUS_POLL_SECONDS=1" \\
        --arm "launcher=" --arm "launcher+spare=--spares 1" [--no-write]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import local_recovery
from ftjob_local.timeline import MOMENTS
from local_common import machine, now_utc, write_section

KEY = "local_recovery_arms"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--arm",
        action="append",
        required=True,
        metavar="NAME=OPTIONS",
        help="an arm: its name and bench/local_recovery.py's options for it (repeatable)",
    )
    p.add_argument("--rounds", type=int, default=2, help="runs of every arm, alternating (default 2)")
    p.add_argument("--out", type=Path, default=None, help="also keep every run's JSON in this folder")
    p.add_argument("--no-write", action="store_true", help="print JSON only; leave bench/RESULTS.md alone")
    args = p.parse_args(argv)
    if any("=" not in a for a in args.arm):
        p.error("--arm takes NAME=OPTIONS")
    return args


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def run(args) -> dict:
    arms = [(name, shlex.split(options)) for name, options in (a.split("=", 1) for a in args.arm)]
    runs: dict[str, list[dict]] = {name: [] for name, _ in arms}
    for round_ in range(1, args.rounds + 1):
        for name, options in arms:
            load = _loadavg()
            res = local_recovery.run(local_recovery.parse_args([*options, "--no-write"]))
            res["arm"], res["round"], res["load_before"], res["load_after"] = name, round_, load, _loadavg()
            runs[name].append(res)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"{name}-{round_}.json").write_text(json.dumps(res, indent=2))
            print(
                f"{time.strftime('%H:%M:%S')} {name} round {round_}: {res['median_total_s']} s",
                file=sys.stderr,
            )
    return {
        "benchmark": KEY,
        "date": now_utc(),
        "machine": machine(),
        "arms": summary(arms, runs),
        "runs": runs,
    }


def summary(arms: list[tuple[str, list[str]]], runs: dict[str, list[dict]]) -> list[dict]:
    out = []
    for name, options in arms:
        done = [r for res in runs[name] for r in res["recoveries"] if "total_s" in r]
        med = lambda xs: round(statistics.median(xs), 2) if xs else None  # noqa: E731
        out.append(
            {
                "arm": name,
                "options": options,
                "totals_s": [r["total_s"] for r in done],
                "median_total_s": med([r["total_s"] for r in done]),
                "lost_steps": sum(res["lost_steps"] for res in runs[name]),
                "failures": sum(res["failures"] or 0 for res in runs[name]),
                "loads": [res["load_before"] for res in runs[name]],
                "median_since_signal_s": {
                    role: {
                        m: med(
                            [
                                r["pods"][role]["since_signal_s"][m]
                                for r in done
                                if role in r["pods"] and r["pods"][role]["since_signal_s"][m] is not None
                            ]
                        )
                        for m in MOMENTS
                    }
                    for role in ("survivor", "replacement")
                },
            }
        )
    return out


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(res: dict) -> str:
    arms = res["arms"]
    lines = [
        "## Local cluster: recovery, arms side by side (`bench/local_recovery_arms.py`)",
        "",
        f"{res['date']}; {res['machine']}. Each arm ran {len(res['runs'][arms[0]['arm']])} time(s), the arms "
        "alternating; 3 preemptions a run (local_recovery.py's job: tiny model, 2:2 workers, no notice, a fresh node "
        "at once). Load average before each run: "
        + "; ".join(f"{a['arm']} {', '.join(_s(x) for x in a['loads'])}" for a in arms)
        + ".",
        "",
        "| arm | options | notice -> first step, median | every preemption | lost steps | failures |",
        "|---|---|---|---|---|---|",
    ]
    for a in arms:
        lines.append(
            f"| {a['arm']} | `{' '.join(a['options']) or '(defaults)'}` | **{_s(a['median_total_s'])}** "
            f"| {', '.join(_s(t) for t in a['totals_s'])} | {a['lost_steps']} | {a['failures']} |"
        )
    lines += [
        "",
        "Median seconds after the signal, survivor / replacement (a warm spare is the replacement):",
        "",
        "| moment | " + " | ".join(a["arm"] for a in arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for m in MOMENTS:
        cells = [
            f"{_s(a['median_since_signal_s']['survivor'][m])} / {_s(a['median_since_signal_s']['replacement'][m])}"
            for a in arms
        ]
        lines.append(f"| {m.replace('_', ' ')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    res = run(args)
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=2))
    if not args.no_write:
        write_section(KEY, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
