"""Recovery at GPU scale (issue 10, item 1): signal -> the first training step after the resume, with its
breakdown, on three paths in one run, next to the machine's limits measured in the same run.

  replacement  SIGTERM to torchrun (what a preempted pod's kubelet sends), then a fresh torchrun on the same
               checkpoint directory, the page cache dropped first (a new node's is cold)
  survivor     the trainer's peer-stop signal (SIGUSR2) to the worker only, as when a peer's pod is preempted:
               it saves to the memory tier, exits 75, and the launcher (torchrun's agent, --max-restarts)
               starts it again in the same "container"; its page cache stays warm (--survivor-signal SIGTERM:
               the rank is treated as preempted itself and saves durably)
  compile      the replacement path with --compile; the TorchInductor cache lives in the work directory, so the
               first torchrun compiles from scratch and the replacement finds the cache warm
  limits       the checkpoint medium's parallel cold-read bandwidth (page cache dropped) and /dev/shm's, so a
               load reads as "X of the medium's bandwidth" (bench/recovery_limits.py)

Each path trains from scratch with --async-checkpoint and a checkpoint every --checkpoint-every steps, and is
signalled --signal-after steps after its first periodic save started (as in the issue: that save may still be
writing). The breakdown comes from the trainer's structured events (ftjob_local.timeline): signal -> stop save
committed -> process exit -> new worker process started -> imports done -> process group ready -> model built
-> checkpoint loaded -> first step, plus the load's bytes and GB/s. Every phase has its own time budget
(--budget-s); a phase over budget is recorded as such and the run goes on. Results: DIR/results.json and
DIR/results.md (bench/recovery_report.py), the trainer logs under DIR/<phase>/.

    python bench/recovery_gpu.py --out DIR                               # an H200: the 1b preset, batch 8 x 2048
    python bench/recovery_gpu.py --out DIR --model tiny --device cpu     # any CPU, in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "trainer_image"), str(REPO / "localcluster")]  # this checkout's, installed or not

import recovery_limits  # noqa: E402
from ftjob_local.procs import kill_tree  # noqa: E402
from ftjob_local.timeline import analyze, breakdown_rows, of, pod_events  # noqa: E402
from ftjob_trainer import contract  # noqa: E402
from recovery_report import goals, markdown  # noqa: E402

PATHS = ("limits", "replacement", "survivor", "compile")
# Per preset: batch per rank, seq len, checkpoint every, --signal-after, probe MiB, budgets (s) per phase.
PROFILES = {
    "1b": dict(batch=8, seq_len=2048, every=40, after=3, probe_mb=4096, budget=(90, 150, 150, 200)),
    "tiny": dict(batch=2, seq_len=64, every=4, after=2, probe_mb=64, budget=(30, 60, 60, 120)),
}


# What starts the workers: ftjob's launcher, as the operator renders a worker pod (torchrun's agent with workers
# forked from an interpreter that imported torch already), or torchrun itself (the baseline).
LAUNCHERS = {"ftjob": "ftjob_trainer.launch", "torchrun": "torch.distributed.run"}


class OverBudget(Exception):
    """A phase ran out of its time budget; the message says what it was waiting for."""


@dataclass
class Launch:
    """One torchrun: its process, its log file, and the trainer events read from that log so far."""

    name: str
    proc: subprocess.Popen
    log: Path
    launched_at: float
    events: list[dict] = field(default_factory=list)
    _offset: int = 0
    _partial: str = ""

    def poll(self) -> list[dict]:
        with open(self.log, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        complete, _, self._partial = text.rpartition("\n")
        self.events += pod_events(complete, self.name)
        return self.events

    def stop(self) -> None:
        """SIGKILL torchrun and its workers (their own sessions included)."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.launches: list[Launch] = []

    # --- processes ---------------------------------------------------------------------------------------------
    def torchrun(
        self,
        phase: str,
        name: str,
        ckpt: Path,
        *,
        restarts: int = 0,
        compile: bool = False,
        memory: Path | None = None,
    ) -> Launch:
        a = self.args
        out = Path(a.out) / phase
        out.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            LAUNCHERS[a.launcher],
            "--standalone",
            f"--nproc-per-node={a.nproc}",
            f"--max-restarts={restarts}",
            "-m",
            "ftjob_trainer.train",
            f"--model={a.model}",
            "--steps=100000",  # never reached: each path ends with a kill after its first step after the resume
            f"--global-batch-size={a.batch * a.nproc}",
            f"--seq-len={a.seq_len}",
            f"--checkpoint-dir={ckpt}",
            f"--checkpoint-every={a.checkpoint_every}",
            "--async-checkpoint",
            "--log-every=1",
            "--save-deadline-seconds=600",  # the stop save is what is measured: never skip it
            f"--termination-log={out / (name + '.termination.log')}",
            *(["--compile"] if compile else []),
            *([f"--memory-checkpoint-dir={memory}"] if memory else []),
            *a.trainer_flag,
        ]
        env = dict(os.environ)
        trainer_dir = str(Path(contract.__file__).resolve().parents[1])  # the trainer this bench imports
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [trainer_dir, env.get("PYTHONPATH")]))
        if a.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
            env.setdefault("OMP_NUM_THREADS", "1")
        if (
            compile
        ):  # fresh caches in the phase's folder: the first torchrun compiles, the next one finds them
            env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(a.workdir) / phase / "inductor-cache")
            env["TRITON_CACHE_DIR"] = str(Path(a.workdir) / phase / "triton-cache")
        log = out / f"{name}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        launch = Launch(name, proc, log, time.time())
        self.launches.append(launch)
        return launch

    def wait(self, launch: Launch, predicate, deadline: float, what: str):
        """Poll the launch's events until predicate(events) is truthy; its value is returned."""
        while True:
            value = predicate(launch.poll())
            if value:
                return value
            if launch.proc.poll() is not None:
                value = predicate(launch.poll())
                if value:
                    return value
                raise RuntimeError(
                    f"{launch.name} exited {launch.proc.returncode} before {what}; see {launch.log}"
                )
            if time.monotonic() > deadline:
                raise OverBudget(f"waiting for {what} ({launch.name})")
            time.sleep(0.05)

    def signal_point(self, launch: Launch, deadline: float) -> dict:
        """Wait until the process trained --signal-after steps past its first periodic save's start."""
        a = self.args

        def reached(events):
            saves = of(events, contract.EVENT_CHECKPOINT_SAVE_STARTED, rank=0)
            periodic = [e for e in saves if e.get("kind") in (None, "periodic")]
            if not periodic:
                return None
            target = periodic[0]["step"] + a.signal_after
            return next((e for e in of(events, contract.EVENT_STEP) if e["step"] >= target), None)

        return self.wait(launch, reached, deadline, f"{a.signal_after} steps after the first periodic save")

    def first_step_after(self, launch: Launch, pid: int | None, deadline: float) -> dict:
        """The first step of a rank-0 process other than pid (the process that resumed)."""
        return self.wait(
            launch,
            lambda evs: next(
                (e for e in of(evs, contract.EVENT_FIRST_STEP, rank=0) if e["pid"] != pid), None
            ),
            deadline,
            "the first step after the resume",
        )

    def memory(self, phase: str, node: str) -> Path | None:
        """The node-local memory tier of one simulated node (--memory-tier), emptied first."""
        if not self.args.memory_tier:
            return None
        path = Path(self.args.memory_tier) / phase / node
        shutil.rmtree(path, ignore_errors=True)
        return path

    # --- the phases ---------------------------------------------------------------------------------------------
    def replacement(self, phase: str, deadline: float, *, compile: bool = False) -> dict:
        ckpt = Path(self.args.workdir) / phase / "ckpt"
        old = self.torchrun(phase, "preempted", ckpt, compile=compile, memory=self.memory(phase, "preempted"))
        self.signal_point(old, deadline)
        sent = time.time()
        old.proc.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
        self.wait(old, lambda _: old.proc.poll() is not None, deadline, "the preempted torchrun to exit")
        old_exited = time.time()
        t = time.perf_counter()
        cache = (
            "warm"
            if self.args.warm_cache
            else recovery_limits.drop_page_cache(recovery_limits.checkpoint_files(ckpt))
        )
        drop_s = time.perf_counter() - t
        # a new node: its own, empty memory folder (the preempted node's went with it)
        new = self.torchrun(
            phase, "replacement", ckpt, compile=compile, memory=self.memory(phase, "replacement")
        )
        self.first_step_after(new, None, deadline)
        new.stop()
        result = self.breakdown(old.events + new.events, sent)
        signal_at = result["signal_received_at"] or sent
        result.update(
            page_cache=cache,
            cache_drop_s=round(drop_s, 3),
            # what the bench saw, seconds after the signal: the old torchrun gone (after its worker's exit event),
            # the new one launched (after the page cache drop)
            torchrun_exited_s=round(old_exited - signal_at, 3),
            torchrun_launched_s=round(new.launched_at - signal_at, 3),
            preempted_torchrun_exit_code=old.proc.returncode,
        )
        return result

    def survivor(self, phase: str, deadline: float) -> dict:
        ckpt = Path(self.args.workdir) / phase / "ckpt"
        run = self.torchrun(phase, "survivor", ckpt, restarts=3, memory=self.memory(phase, "survivor"))
        self.signal_point(run, deadline)
        worker = of(run.events, contract.EVENT_PROCESS_STARTED, rank=0)[0]["pid"]
        sent = time.time()
        # the worker only, with the trainer's default --peer-stop-signals (SIGUSR2): what a survivor's rank
        # hears when a peer's pod is preempted (it stops with it, saves to memory only, exits 75) and the
        # launcher restarts it in the same container. --survivor-signal SIGTERM: as if this rank were preempted
        # (its stop save goes to the durable tier), the measurement before the memory tier.
        os.kill(worker, getattr(signal, self.args.survivor_signal))
        self.first_step_after(run, worker, deadline)
        run.stop()
        return {**self.breakdown(run.events, sent), "page_cache": "warm (same machine, not dropped)"}

    def breakdown(self, events: list[dict], sent: float) -> dict:
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
            "stop_save": self.stop_save(events, r.stop_steps),
        }

    @staticmethod
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

    def limits(self, phase: str, deadline: float) -> dict:  # noqa: ARG002 - every phase takes its deadline
        a = self.args
        threads = a.read_threads
        return {
            "checkpoint_medium": recovery_limits.medium(Path(a.workdir) / "probe", a.probe_mb, threads),
            "dev_shm": recovery_limits.shm(a.probe_mb, threads),
        }


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def machine(device: str) -> dict:
    info = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        if device == "cuda" and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        "--paths", default=None, help=f"comma-separated subset of {','.join(PATHS)} (cpu: no compile)"
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
    p.add_argument("--workdir", type=Path, default=None, help="checkpoints and probes (default: a temp dir)")
    a = p.parse_args(argv)
    prof = PROFILES[a.model]
    a.device = a.device or ("cuda" if _has_cuda() else "cpu")
    for key, name in (("batch", "batch"), ("seq_len", "seq_len"), ("checkpoint_every", "every")):
        if getattr(a, key) is None:
            setattr(a, key, prof[name])
    a.signal_after = prof["after"] if a.signal_after is None else a.signal_after
    a.probe_mb = prof["probe_mb"] if a.probe_mb is None else a.probe_mb
    default_paths = PATHS if a.device == "cuda" else PATHS[:3]
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


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    own_workdir = a.workdir is None
    a.workdir = Path(a.workdir or tempfile.mkdtemp(prefix="ftjob-recovery-"))
    bench = Bench(a)
    result: dict = {
        "benchmark": "recovery_gpu",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(a.device),
        "config": {
            k: getattr(a, k)
            for k in (
                "model",
                "device",
                "nproc",
                "batch",
                "seq_len",
                "checkpoint_every",
                "signal_after",
                "trainer_flag",
                "probe_mb",
                "launcher",
                "survivor_signal",
            )
        }
        | {
            "read_threads": a.read_threads,
            "budgets_s": a.budgets,
            "workdir": str(a.workdir),
            "memory_tier": a.memory_tier and str(a.memory_tier),
        },
        "phases": {},
    }
    phases = {
        "limits": bench.limits,
        "replacement": bench.replacement,
        "survivor": bench.survivor,
        "compile": lambda phase, deadline: bench.replacement(phase, deadline, compile=True),
    }
    try:
        for phase in a.paths:
            started = time.monotonic()
            try:
                doc = phases[phase](phase, started + a.budgets[phase])
            except OverBudget as e:
                doc = {"error": f"over its budget of {a.budgets[phase]:g} s {e}"}
            except (RuntimeError, OSError) as e:
                doc = {"error": str(e)}
            finally:
                for launch in bench.launches:
                    launch.stop()
                bench.launches.clear()
                shutil.rmtree(
                    a.workdir / phase, ignore_errors=True
                )  # tens of GB at 1b: free them for the next
            doc["phase_s"] = round(time.monotonic() - started, 2)
            result["phases"][phase] = doc
            print(f"{phase}: {json.dumps(doc)}", flush=True)
            result["goals"] = goals(result)
            (a.out / "results.json").write_text(
                json.dumps(result, indent=1)
            )  # after every phase: partial ones count
            (a.out / "results.md").write_text(markdown(result))
    finally:
        if own_workdir:
            shutil.rmtree(a.workdir, ignore_errors=True)
    print(markdown(result))
    return 0 if all("error" not in d for d in result["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
