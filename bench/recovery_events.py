"""The trainer's and the launcher's events (contract.py) read into a recovery's breakdown, for
bench/recovery_gpu.py: the moments after a signal, the stop save, the replacement launcher's start-up."""

from __future__ import annotations

import pickle

from ftjob_local.timeline import analyze, breakdown_rows, of
from ftjob_trainer import contract


def breakdown(events: list[dict], sent: float) -> dict:
    """The recovery of the resume that followed the signal, from the events of its launches."""
    resumes = [r for r in analyze(events).resumes if r.t_loaded > sent]
    if not resumes or not resumes[0].pods:
        raise RuntimeError("no resume after the signal in the trainer's events")
    r = resumes[0]
    rec = r.pods[0]
    rows = breakdown_rows(rec)
    return {
        "role": rec.role,
        "signal_received_at": r.t_signal,
        "signal_sent_to_received_s": None if r.t_signal is None else round(r.t_signal - sent, 3),
        "stopped_at_step": r.stop_steps,
        "stop_reasons": r.stop_reasons,
        "resumed_from_step": r.from_step,
        "breakdown": [
            {"moment": m, "since_signal_s": _r(since), "since_previous_s": _r(step)}
            for m, since, step in rows
        ],
        "total_s": _r(rec.total()),
        "load_bytes": rec.load_bytes,
        "load_seconds": _r(rec.load_seconds),
        "load_gbps": _r(rec.load_gbps),
        # where the resume's files came from (contract.TIER_*), one entry per rank
        "load_tiers": sorted(
            {e.get("tier") for e in of(events, contract.EVENT_CHECKPOINT_LOADED) if e["time"] > sent} - {None}
        ),
        "stop_save": stop_save(events, r.stop_steps),
        "stopped_teardown": stopped_teardown(events, sent),
    }


def stopped_teardown(events: list[dict], sent: float) -> dict | None:
    """Rank 0's stopped worker between its stop and its exit (contract.EVENT_EXIT's teardown), seconds."""
    exits = [e for e in of(events, contract.EVENT_EXIT, rank=0) if e["time"] > sent]
    return exits[0].get("teardown") if exits else None


def stop_save(events: list[dict], steps: list[int]) -> dict | None:
    """Rank 0's stop save: what it waited for, how long it took, how many bytes."""
    started = [
        e for e in of(events, contract.EVENT_CHECKPOINT_SAVE_STARTED, rank=0) if e.get("step") in steps
    ]
    committed = [e for e in of(events, contract.EVENT_CHECKPOINT_COMMITTED) if e.get("step") in steps]
    if not committed:
        return None
    c = committed[-1]
    return {
        "step": c["step"],
        "bytes": c.get("bytes"),
        "seconds": c.get("seconds"),
        "kind": c.get("kind"),
        "waited_for_step": started[-1].get("waits_for") if started else None,
        "started_to_committed_s": _r(c["time"] - started[-1]["time"]) if started else None,
    }


def launcher_moments(events: list[dict], signal_at: float) -> dict:
    """The replacement launcher's start-up, seconds after the signal (negative: before it, a spare's): its agent's
    imports, its forkserver's, the last round it joined, and its read-ahead."""

    def last(name: str) -> float | None:
        found = of(events, name)
        return round(found[-1]["time"] - signal_at, 3) if found else None

    read = of(events, contract.EVENT_READ_AHEAD_DONE)
    return {
        "agent_imported_s": last(contract.EVENT_LAUNCHER_READY),
        "forkserver_imported_s": last(contract.EVENT_WARM_IMPORTS_DONE),
        "round_formed_s": last(contract.EVENT_ROUND_FORMED),
        # its agent's read-ahead of the checkpoint (ftjob_trainer.read_ahead): when it ended, what it read
        "read_ahead_done_s": last(contract.EVENT_READ_AHEAD_DONE),
        "read_ahead_step": read[-1]["step"] if read else None,
        "read_ahead_bytes": read[-1]["bytes"] if read else None,
        "read_ahead_seconds": read[-1]["seconds"] if read else None,
    }


def preempted_left(events: list[dict], signal_at: float) -> dict:
    """When the preempted launcher's agent left the rendezvous (after its stop commit), seconds after the signal:
    the round the replacement waits for can form from then on."""
    left = of(events, contract.EVENT_RENDEZVOUS_LEFT)
    return {
        "preempted_left_s": round(left[0]["time"] - signal_at, 3) if left else None,
        "preempted_left_why": left[0].get("why") if left else None,
    }


def waiting_agents(store, run_id: str) -> set[int]:
    """The pids of the agents c10d's rendezvous state holds as waiting (its wait and redundancy lists)."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    got = C10dRendezvousBackend(store, run_id).get_state()
    if got is None:
        return set()
    state = pickle.loads(got[0])
    return {n.pid for n in state.wait_list | getattr(state, "redundancy_list", set())}


def durable_stop_commit(events: list[dict]) -> dict | None:
    return next(
        (
            e
            for e in of(events, contract.EVENT_CHECKPOINT_COMMITTED)
            if e.get("kind") == contract.KIND_STOP and e.get("tier") == contract.TIER_DURABLE
        ),
        None,
    )


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)
