"""bench/recovery_gpu.py's command line: the presets' defaults, the phases and their time budgets."""

from __future__ import annotations

import argparse
from pathlib import Path

PATHS = (
    "limits",
    "replacement",
    "replacement_cold",
    "survivor",
    "spare",
    "notice",
    "compile",
    "spare_compile",
    "notice_compile",
)
# Per preset: batch per rank, seq len, checkpoint every, --signal-after, probe MiB, budgets (s) per phase.
PROFILES = {
    "1b": dict(
        batch=8,
        seq_len=2048,
        every=40,
        after=3,
        probe_mb=4096,
        budget=(90, 150, 150, 150, 200, 200, 200, 240, 240),
    ),
    "tiny": dict(
        batch=2, seq_len=64, every=4, after=2, probe_mb=64, budget=(30, 60, 60, 60, 90, 90, 120, 120, 120)
    ),
}


# What starts the workers: ftjob's launcher, as the operator renders a worker pod (torchrun's agent with workers
# forked from an interpreter that imported torch already), or torchrun itself (the baseline).
LAUNCHERS = {"ftjob": "ftjob_trainer.launch", "torchrun": "torch.distributed.run"}


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, type=Path, help="directory for results.json, results.md and logs")
    p.add_argument("--model", default="1b", choices=sorted(PROFILES), help="preset (default 1b)")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"), help="default: cuda when there is one")
    p.add_argument("--nproc", type=int, default=1, help="ranks (GPUs) per torchrun (default 1)")
    p.add_argument("--batch", type=int, default=None, help="samples per rank per step (1b: 8)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sample (1b: 2048)")
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps between periodic saves (1b: 40)")
    p.add_argument(
        "--signal-after", type=int, default=None, help="steps after the first periodic save (1b: 3)"
    )
    p.add_argument(
        "--paths", default=None, help=f"comma-separated subset of {','.join(PATHS)} (cpu: none with compile)"
    )
    p.add_argument(
        "--budget-s",
        action="append",
        default=[],
        metavar="[PHASE=]SECONDS",
        help="time budget of a phase (or of every phase without PHASE=); repeatable",
    )
    p.add_argument("--probe-mb", type=int, default=None, help="MiB written to probe the medium (1b: 4096)")
    p.add_argument(
        "--read-threads", type=int, default=8, help="threads of the parallel read probes (default 8)"
    )
    p.add_argument(
        "--memory-tier",
        type=Path,
        default=None,
        metavar="DIR",
        help="node-local memory tier root (e.g. /dev/shm/ftjob-bench): one folder per simulated node",
    )
    p.add_argument(
        "--trainer-flag",
        action="append",
        default=[],
        metavar="FLAG=VALUE",
        help="extra trainer flag; repeatable",
    )
    p.add_argument(
        "--survivor-signal",
        default="SIGUSR2",
        choices=("SIGUSR2", "SIGTERM"),
        help="survivor path: SIGUSR2, the trainer's peer-stop signal (default); SIGTERM: its own preemption",
    )
    p.add_argument(
        "--launcher",
        default="ftjob",
        choices=sorted(LAUNCHERS),
        help="ftjob: python -m ftjob_trainer.launch, as worker pods run (default); torchrun: torch's own",
    )
    p.add_argument("--warm-cache", action="store_true", help="replacements: keep the page cache (no drop)")
    p.add_argument(
        "--replacement-drop",
        default="checkpoint",
        choices=("all", "checkpoint"),
        help="the replacement and compile paths' page cache drop: checkpoint (only the checkpoint's files, as the "
        "spare and notice paths evict: a node whose image was just pulled; default) or all (drop_caches where it "
        "can: torch's libraries read cold too, a node that never ran the image; replacement_cold always does)",
    )
    p.add_argument(
        "--pycache-prefix",
        type=Path,
        default=None,
        metavar="DIR",
        help="every process of the bench reads and writes compiled bytecode under DIR (PYTHONPYCACHEPREFIX), the "
        "forkserver's imports compiled before the first phase: a Python install with .pyc, as the trainer image "
        "builds it (default: the install as it is, which may have none)",
    )
    p.add_argument("--workdir", type=Path, default=None, help="checkpoints and probes (default: a temp dir)")
    a = p.parse_args(argv)
    prof = PROFILES[a.model]
    a.device = a.device or ("cuda" if _has_cuda() else "cpu")
    for key, name in (("batch", "batch"), ("seq_len", "seq_len"), ("checkpoint_every", "every")):
        if getattr(a, key) is None:
            setattr(a, key, prof[name])
    a.signal_after = prof["after"] if a.signal_after is None else a.signal_after
    a.probe_mb = prof["probe_mb"] if a.probe_mb is None else a.probe_mb
    default_paths = [x for x in PATHS if a.device == "cuda" or "compile" not in x]
    a.paths = [x.strip() for x in a.paths.split(",")] if a.paths else list(default_paths)
    if bad := [x for x in a.paths if x not in PATHS]:
        p.error(f"--paths: unknown {bad}; pick from {PATHS}")
    a.budgets = dict(zip(PATHS, prof["budget"], strict=True))
    for spec in a.budget_s:
        phase, _, seconds = spec.rpartition("=")
        if phase and phase not in PATHS:
            p.error(f"--budget-s {spec}: unknown phase {phase!r}; pick from {PATHS}")
        for key in [phase] if phase else PATHS:
            a.budgets[key] = float(seconds)
    return a


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
