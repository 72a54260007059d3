"""Render trainer_bench.py's results.json as the "Trainer (H200)" section of bench/RESULTS.md.

    python bench/trainer_results.py RESULTS_JSON [--before EARLIER_JSON] [--write bench/RESULTS.md]

Only the text between `<!-- trainer: start -->` and `<!-- trainer: end -->` changes (appended if absent); the
file is re-read right before writing, so other sections written meanwhile stay as they are.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

START, END = "<!-- trainer: start -->", "<!-- trainer: end -->"


def fmt_rate(x: float) -> str:
    return f"{x / 1000:.1f}k tok/s"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _read(c: dict) -> str:
    """The read alone, from the trainer's checkpoint_loaded event (results before the events lack it)."""
    if not c.get("load_read_gbps_per_rank"):
        return ""
    return f"; the read itself {c['load_read_seconds']:.2f} s at {c['load_read_gbps_per_rank']:.2f} GB/s per rank"


def render(doc: dict, before: dict | None, notes: list[str] | None = None) -> str:
    t, c, comp, g = doc["throughput"], doc["checkpoint"], doc.get("compile"), doc["goals"]
    cfg = doc["config"]
    plain = t["plain_fsdp2_tokens_per_s"]
    ok = lambda key: "met" if g.get(key) else ("n/a" if g.get(key) is None else "**NOT met**")  # noqa: E731
    lines = [
        "## Trainer (H200) (`bench/trainer_bench.py`)",
        "",
        f"{doc['date']}; {doc['machine']} (host {doc['host']}), torch {doc['torch']}, world size "
        f"{doc['world_size']}; model {cfg['model']}, batch {cfg['batch']} x {cfg['seq_len']} tokens per GPU, "
        f"bf16 params / fp32 reduce, eager unless noted; {cfg['rounds']} alternating rounds of {cfg['steps']} "
        "steps (median). MFU: 6 x non-embedding params + attention (12 x layers x dim x seq) FLOPs per token, "
        "against 989 TFLOP/s dense bf16.",
        "",
        "| figure | value | against the plain FSDP2 baseline of this run | goal |",
        "|---|---|---|---|",
        f"| plain FSDP2 throughput | {fmt_rate(plain)}, MFU {pct(t['plain_mfu'])} | 1.00 | |",
        f"| engine throughput (with the per-step stop agreement) | {fmt_rate(t['engine_tokens_per_s'])}, MFU "
        f"{pct(t['engine_mfu'])} | **{t['engine_over_plain']:.3f}** | >= 0.95: {ok('engine_over_plain>=0.95')} |",
    ]
    if comp:
        lines.append(
            f"| engine + `--compile` | {fmt_rate(comp['compile_tokens_per_s'])}, MFU **{pct(comp['compile_mfu'])}** "
            f"(compile warm-up {comp['compile_warmup_seconds']:.1f} s) | {comp['compile_tokens_per_s'] / plain:.3f} "
            f"| MFU 60%: {ok('compile_mfu>=0.60')} |"
        )
    step = c["step_seconds"]
    stalls = ", ".join(f"{s:.3f}" for s in c["async_save_stall_seconds"])
    warm = c.get("staging_warm_up_seconds")
    lines += [
        f"| stall per periodic async save (save call + wait for staging before the next optimizer step, minus a "
        f"normal step of {step:.3f} s) | [{stalls}] s, max **{c['async_save_stall_max_seconds']:.3f} s** | "
        f"max = {c['async_save_stall_max_seconds'] / step:.2f} engine steps | <= 1 s: {ok('async_save_stall<=1s')} |",
        f"| background write per async save (training on meanwhile) | "
        f"{', '.join(f'{s:.1f}' for s in c['async_save_background_seconds'])} s | | |",
    ]
    if warm is not None:
        lines.append(
            f"| pinned staging buffers warmed in the background after the first step | {warm:.1f} s (first save "
            f"after step {c.get('steps_before_first_save')}) | | |"
        )
    phases = c.get("sigterm_save_phases_seconds") or {}
    lines += [
        f"| SIGTERM -> committed checkpoint | **{c['sigterm_to_commit_seconds']:.2f} s** for "
        f"{c['state_bytes'] / 1e9:.2f} GB ({c.get('write_threads', 1)} writer threads per rank) | ideal = state / "
        f"disk write bandwidth ({c['disk_write_bytes_per_s'] / 1e9:.2f} GB/s measured) = "
        f"{c['ideal_write_seconds']:.2f} s; ratio **{c['sigterm_to_commit_over_ideal']:.2f}** | <= 1.25: "
        f"{ok('sigterm_to_commit_over_ideal<=1.25')} |",
    ]
    if phases:
        lines.append(
            "| where the SIGTERM save's time went (cumulative s from the save call) | "
            + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
            + " | | |"
        )
    lines += [
        f"| load of the latest checkpoint at resume (page cache dropped) | {c['load_seconds']:.2f} s "
        f"({c['state_bytes'] / c['load_seconds'] / 1e9:.2f} GB/s){_read(c)} | | |",
        "",
    ]
    if before:
        bt, bc = before["throughput"], before["checkpoint"]
        lines += [
            f"Before the fixes of this round (same machine kind, {before['date']}, torch {before['torch']}): plain "
            f"{fmt_rate(bt['plain_fsdp2_tokens_per_s'])}, engine {fmt_rate(bt['engine_tokens_per_s'])} (MFU "
            f"{pct(bt['engine_mfu'])}), compile MFU "
            f"{pct((before.get('compile') or {}).get('compile_mfu'))}, async stalls "
            f"[{', '.join(f'{s:.2f}' for s in bc['async_save_stall_seconds'])}] s, SIGTERM -> commit "
            f"{bc['sigterm_to_commit_seconds']:.1f} s (ratio {bc['sigterm_to_commit_over_ideal']:.2f}), load "
            f"{bc['load_seconds']:.1f} s.",
            "",
        ]
    for note in notes or []:
        lines += [f"- {note}"]
    if notes:
        lines.append("")
    raw = {k: v for k, v in doc.items() if k != "profile"}
    lines += [
        "<details><summary>raw results.json (the profile's top kernels left out)</summary>",
        "",
        "```json",
        json.dumps(raw, indent=1),
        "```",
        "</details>",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="results.json of bench/trainer_bench.py")
    p.add_argument("--before", help="an earlier results.json to quote for comparison")
    p.add_argument("--write", help="RESULTS.md to update in place (default: print the section)")
    p.add_argument("--note", action="append", default=[], help="a remark listed under the table (repeatable)")
    a = p.parse_args(argv)
    doc = json.loads(Path(a.results).read_text())
    before = json.loads(Path(a.before).read_text()) if a.before else None
    section = f"{START}\n{render(doc, before, a.note)}\n{END}"
    if not a.write:
        print(section)
        return 0
    path = Path(a.write)
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    text = (
        pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    )
    path.write_text(text if text.endswith("\n") else text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
