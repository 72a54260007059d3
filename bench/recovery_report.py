"""bench/recovery_gpu.py's results as goals (issue 10) and as a markdown section for bench/RESULTS.md.

python bench/recovery_report.py RESULTS_JSON [--write bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recovery_args import PATHS

# Issue 10's goals on the H200 with the 1b preset: signal -> first step per path, seconds. Every replacement path
# has the replacement's goal, the --compile ones the --compile replacement's: "replacement"/"compile" launch after
# the old process is gone, "spare"/"spare_compile" have a warm spare (spec.workers.spares), "notice"/"notice_compile"
# launch with the signal (the operator's order without a spare).
GOAL_TOTAL_S = {
    "survivor": 12.0,
    "replacement": 20.0,
    "replacement_cold": 20.0,
    "spare": 20.0,
    "notice": 20.0,
    "compile": 30.0,
    "spare_compile": 30.0,
    "notice_compile": 30.0,
}
GOAL_LOAD_OF_MEDIUM = 0.8  # a durable load at >= 0.8 x the medium's parallel cold-read bandwidth
GOAL_MEMORY_LOAD_GBPS = 8.0  # a load whose files all came from the memory tier (the survivor's)
# What each way of emptying the page cache before a new node's load leaves warm.
PAGE_CACHE = {
    "drop_caches": "whole page cache dropped (drop_caches: torch's libraries read cold too)",
    "fadvise": "the checkpoint's files evicted (fadvise; libraries stay cached)",
}
RECOVERY_PATHS = tuple(p for p in PATHS if p != "limits")  # every phase but the machine's limits


def _medium_gbps(result: dict) -> float | None:
    return ((result["phases"].get("limits") or {}).get("checkpoint_medium") or {}).get(
        "cold_read_parallel_gbps"
    )


def cold_load_path(result: dict) -> str | None:
    """The replacement path whose load read the medium cold: its launcher did not read ahead."""
    return next(
        (
            p
            for p in ("replacement_cold", "replacement")
            if (result["phases"].get(p) or {}).get("read_ahead") is False
        ),
        None,
    )


def load_of_medium(result: dict, path: str) -> float | None:
    """The path's load bandwidth as a fraction of the medium's parallel cold read."""
    medium, load = _medium_gbps(result), (result["phases"].get(path) or {}).get("load_gbps")
    return round(load / medium, 3) if medium and load else None


def goals(result: dict) -> dict:
    """goal -> {"value", "met"}; met is None where the run cannot say (not the 1b preset on a GPU, or no figure)."""
    cfg = result["config"]
    applies = cfg["model"] == "1b" and cfg["device"] == "cuda"
    out = {}
    for path, limit in GOAL_TOTAL_S.items():
        value = (result["phases"].get(path) or {}).get("total_s")
        out[f"{path}: signal -> first step <= {limit:g} s"] = {
            "value": value,
            "met": value <= limit if applies and value is not None else None,
        }
    cold = cold_load_path(result)
    frac = load_of_medium(result, cold) if cold else None
    out[f"{cold or 'replacement'}: load >= {GOAL_LOAD_OF_MEDIUM:g} x the medium's parallel cold read"] = {
        "value": frac,
        "met": frac >= GOAL_LOAD_OF_MEDIUM if applies and frac is not None else None,
    }
    survivor = result["phases"].get("survivor") or {}
    gbps = survivor.get("load_gbps") if survivor.get("load_tiers") == ["memory"] else None
    out[f"survivor: load from the memory tier >= {GOAL_MEMORY_LOAD_GBPS:g} GB/s"] = {
        "value": gbps,
        "met": gbps >= GOAL_MEMORY_LOAD_GBPS if applies and gbps is not None else None,
    }
    return out


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**NOT met**", None: "n/a"}[met]


def imports_line(imports: dict) -> list[str]:
    """The forkserver's imports step by step, per try (recovery_limits.imports)."""
    if not imports:
        return []
    if "error" in imports:
        return [f"Imports in a fresh interpreter: failed ({imports['error']}).", ""]
    tries = "; ".join(
        ", ".join(f"{k} {v:.2f}" for k, v in t.items() if isinstance(v, float) and k != "interpreter_s")
        + f" (interpreter {t['interpreter_s']:.2f})"
        for t in imports["tries"]
    )
    cached = imports["tries"][0]["bytecode_cached"]
    return [
        f"Imports in a fresh interpreter, seconds per step as the forkserver takes them: {tries}; torch's "
        f"bytecode cached: {'yes' if cached else 'no'}.",
        "",
    ]


def markdown(result: dict, remarks: list[str] | None = None) -> str:
    cfg, m = result["config"], result["machine"]
    lines = [
        "## Recovery at GPU scale (`bench/recovery_gpu.py`)",
        "",
        f"{result['date']}; {m.get('gpu') or 'CPU'} (host {m.get('host')}, {m.get('cpus')} CPUs), torch "
        f"{m.get('torch')}; model {cfg['model']} on {cfg['device']}, {cfg['nproc']} rank(s), batch {cfg['batch']} x "
        f"{cfg['seq_len']} per rank, --async-checkpoint, checkpoint every {cfg['checkpoint_every']}, signal "
        f"{cfg['signal_after']} steps after the first periodic save started.",
        "",
    ]
    if bytecode := result.get("bytecode"):
        done = (
            bytecode.get("error")
            or f"the forkserver's imports compiled in {bytecode['compile_s']:.2f} s first"
        )
        lines += [
            f"Bytecode: cached under {bytecode['prefix']} for every process (`--pycache-prefix`; {done}).",
            "",
        ]
    limits = result["phases"].get("limits") or {}
    if limits.get("error"):
        lines += [f"Limits: {limits['error']}", ""]
    elif limits:
        med, shm = limits["checkpoint_medium"], limits["dev_shm"]
        lines += [
            "| limit (measured in this run) | GB/s |",
            "|---|---|",
            f"| checkpoint medium ({med['fstype'] or '?'} at {med['mount'] or '?'}): write + fsync, "
            f"{med['threads']} streams | {med['write_fsync_parallel_gbps']:.2f} |",
            f"| checkpoint medium: cold read, {med['threads']} threads (page cache dropped: {med['cache_drop']}) "
            f"| **{med['cold_read_parallel_gbps']:.2f}** |",
            f"| checkpoint medium: cold read, one stream | {med['cold_read_one_stream_gbps']:.2f} |",
        ]
        if "error" in shm:
            lines.append(f"| /dev/shm | {shm['error']} |")
        else:
            lines += [
                f"| /dev/shm: write, one stream | {shm['write_one_stream_gbps']:.2f} |",
                f"| /dev/shm: read, one stream / {shm['threads']} threads | {shm['read_one_stream_gbps']:.2f} / "
                f"{shm['read_parallel_gbps']:.2f} |",
            ]
        lines += ["", *imports_line(limits.get("imports") or {})]
    done = [p for p in RECOVERY_PATHS if p in result["phases"] and "breakdown" in result["phases"][p]]
    if done:
        moments = [row["moment"] for row in result["phases"][done[0]]["breakdown"]]
        lines += [
            "Seconds after the signal (the trainer's own clock of it), from the trainer's events:",
            "",
            "| path | " + " | ".join(x.replace("_", " ") for x in moments) + " | load | of the medium |",
            "|---|" + "---|" * (len(moments) + 2),
        ]
        for p in done:
            d = result["phases"][p]
            cells = [_s(row["since_signal_s"]) for row in d["breakdown"]]
            cells[-1] = f"**{cells[-1]}**"
            load = (
                f"{d['load_bytes'] / 1e9:.2f} GB at {d['load_gbps']:.2f} GB/s" if d.get("load_gbps") else "-"
            )
            frac = _s(load_of_medium(result, p))
            if (d.get("launcher") or {}).get("read_ahead_done_s") is not None:
                frac += " (read ahead: not a cold read)"
            lines.append(f"| {p} | " + " | ".join(cells) + f" | {load} | {frac} |")
        lines.append("")
        for p in done:
            d = result["phases"][p]
            save = d.get("stop_save") or {}
            cache = d.get("page_cache") or "?"
            notes = [PAGE_CACHE.get(cache, f"page cache {cache}")]
            if d.get("read_ahead") is False:
                notes.append("the launcher's read-ahead off")
            if save:
                notes.append(
                    f"stop save of step {save['step']}: {_s(save.get('started_to_committed_s'))} s from its start to "
                    f"the commit, waited for the save of step {save.get('waited_for_step')}"
                    if save.get("waited_for_step") is not None
                    else f"stop save of step {save['step']}: {_s(save.get('started_to_committed_s'))} s"
                )
            if d.get("stopped_teardown"):
                down = d["stopped_teardown"]
                notes.append(
                    f"the stopped worker's teardown: checkpointer and report {_s(down.get('close_s'))} s, process "
                    f"group {_s(down.get('process_group_s'))} s"
                )
            if d.get("torchrun_exited_s") is not None:
                notes.append(
                    f"the old torchrun was gone at {d['torchrun_exited_s']:.2f} s and the new one launched at "
                    f"{d['torchrun_launched_s']:.2f} s ("
                    + (
                        f"the checkpoint's files evicted at the stop commit, {d['cache_evicted_s']:.2f} s"
                        if d.get("cache_evicted_s") is not None
                        else f"page cache drop {d['cache_drop_s']:.2f} s"
                    )
                    + ")"
                )
            if d.get("launched_s") is not None:
                notes.append(
                    f"the replacement's launcher started {round(d['launched_s'], 2) + 0.0:.2f} s after the signal"
                )
            if d.get("launcher"):
                up = d["launcher"]
                notes.append(
                    f"its agent had imported torch at {_s(up['agent_imported_s'])} s, its forkserver the trainer at "
                    f"{_s(up['forkserver_imported_s'])} s, and its round formed at {_s(up['round_formed_s'])} s"
                    + (
                        f", the preempted agent having left the rendezvous at {_s(up['preempted_left_s'])} s "
                        f"({up.get('preempted_left_why')})"
                        if up.get("preempted_left_s") is not None
                        else ""
                    )
                )
                if up.get("read_ahead_done_s") is not None:
                    notes.append(
                        f"its agent read ahead {up['read_ahead_bytes'] / 1e9:.2f} GB of step {up['read_ahead_step']} "
                        f"in {up['read_ahead_seconds']:.2f} s, done at {_s(up['read_ahead_done_s'])} s"
                    )
            if d.get("cache_dropped_s") is not None:
                before = "before" if d.get("cache_dropped_before_load") else "NOT before"
                notes.append(
                    f"the stop save's files left the page cache at {d['cache_dropped_s']:.2f} s, {before} the "
                    "replacement read them"
                )
            lines.append(f"- {p}: " + "; ".join(notes) + ".")
    for p, d in result["phases"].items():
        if "error" in d:
            lines.append(f"- {p}: **{d['error']}**")
    lines += ["", "| goal (issue 10) | this run | |", "|---|---|---|"]
    for goal, g in (result.get("goals") or {}).items():
        lines.append(f"| {goal} | {_s(g['value'])} | {_verdict(g['met'])} |")
    if remarks:
        lines += ["", *(f"- {remark}" for remark in remarks)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--write", type=Path, default=None, help="put the section into this RESULTS.md")
    p.add_argument(
        "--note", action="append", default=[], help="a remark listed under the tables (repeatable)"
    )
    a = p.parse_args(argv)
    text = markdown(json.loads(a.results.read_text()), a.note)
    if a.write:
        from local_common import write_section

        write_section("recovery_gpu", text, a.write)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
