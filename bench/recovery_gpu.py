"""Recovery at GPU scale (issue 10, item 1): signal -> the first training step after the resume, with its
breakdown, on three paths in one run, next to the machine's limits measured in the same run.

  replacement  SIGTERM to torchrun (what a preempted pod's kubelet sends), then a fresh torchrun on the same
               checkpoint directory once the old one is gone, the checkpoint's files evicted from the page cache
               while the stop save writes and at its commit (a new node that has just pulled the image: its
               libraries are cached, its checkpoint is not; --replacement-drop=all drops everything after the exit)
  replacement_cold  the replacement path with the whole page cache dropped (torch's libraries read cold too) and
               the launcher's read-ahead off (FTJOB_READ_AHEAD=0): the slowest start, and the durable load's cold
               bandwidth that the 0.8 x medium goal is judged on
  survivor     the trainer's peer-stop signal (SIGUSR2) to the worker only, as when a peer's pod is preempted:
               it saves to the memory tier, exits 75, and the launcher (torchrun's agent, --max-restarts)
               starts it again in the same "container"; its page cache stays warm (--survivor-signal SIGTERM:
               the rank is treated as preempted itself and saves durably)
  spare        the replacement path with a warm spare (spec.workers.spares: 1): a second launcher waits in the
               rendezvous, imported, before the signal; the first one's agent leaves the round after its stop save
               and the spare's worker starts at once (the stop save's pages evicted from the page cache while it
               writes and at its commit, so the spare reads them cold, as another node would)
  compile      the replacement path with --compile; the TorchInductor cache lives in the work directory, so the
               first torchrun compiles from scratch and the replacement finds the cache warm
  spare_compile  the spare path with --compile: the spare compiles after it joins, from the cache the preempted
               worker filled (as the trainer keeps it next to the checkpoints)
  notice       the replacement path without a spare, in the operator's order: the replacement's launcher starts
               with the signal (the operator creates the replacement pod once the lost one is deleting), imports
               and waits in the rendezvous while the preempted worker saves; otherwise as the spare path. A real
               cluster adds the pod's scheduling, a free node and the image pull, which this bench does not model
  notice_compile  the notice path with --compile
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
    python bench/recovery_gpu.py --out DIR --pycache-prefix /tmp/pyc     # with .pyc, as the trainer image has it
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
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "trainer_image"), str(REPO / "localcluster")]  # this checkout's, installed or not

import recovery_limits  # noqa: E402
from ftjob_local.procs import kill_tree  # noqa: E402
from ftjob_local.timeline import of, pod_events  # noqa: E402
from ftjob_trainer import contract  # noqa: E402
from ftjob_trainer.read_ahead import ENV_READ_AHEAD  # noqa: E402
from recovery_args import LAUNCHERS, parse_args  # noqa: E402
from recovery_events import (  # noqa: E402
    breakdown,
    durable_stop_commit,
    launcher_moments,
    preempted_left,
    waiting_agents,
)
from recovery_report import goals, markdown  # noqa: E402


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
        rdzv: list[str] | None = None,
        env_extra: dict[str, str] | None = None,
    ) -> Launch:
        """One launcher; rdzv: its rendezvous flags (default --standalone); env_extra: its own environment."""
        a = self.args
        out = Path(a.out) / phase
        out.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            LAUNCHERS[a.launcher],
            *(rdzv or ["--standalone"]),
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
        if rdzv:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as the operator renders worker pods
        if a.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
            env.setdefault("OMP_NUM_THREADS", "1")
        if (
            compile
        ):  # fresh caches in the phase's folder: the first torchrun compiles, the next one finds them
            env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(a.workdir) / phase / "inductor-cache")
            env["TRITON_CACHE_DIR"] = str(Path(a.workdir) / phase / "triton-cache")
        env.update(env_extra or {})
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

    def evict_through_commit(self, old: Launch, ckpt: Path, deadline: float) -> float:
        """Evicts the checkpoint's files from the page cache while the preempted worker's stop save writes (each
        file's pages once fsynced), and all of them once more at its durable commit; returns when (time.time())."""
        evicting = threading.Event()
        threading.Thread(target=recovery_limits.evict_until, args=(ckpt, evicting), daemon=True).start()
        try:
            self.wait(old, lambda evs: durable_stop_commit(evs), deadline, "the stop save's durable commit")
        finally:
            evicting.set()
        recovery_limits.evict(recovery_limits.checkpoint_files(ckpt))
        return time.time()

    # --- the phases ---------------------------------------------------------------------------------------------
    def replacement(
        self,
        phase: str,
        deadline: float,
        *,
        compile: bool = False,
        drop: str | None = None,
        read_ahead: bool = True,
    ) -> dict:
        ckpt = Path(self.args.workdir) / phase / "ckpt"
        old = self.torchrun(phase, "preempted", ckpt, compile=compile, memory=self.memory(phase, "preempted"))
        self.signal_point(old, deadline)
        drop = "warm" if self.args.warm_cache else (drop or self.args.replacement_drop)
        sent = time.time()
        old.proc.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
        evicted_at = None
        if drop == "checkpoint":
            # Another node has none of the checkpoint's pages. They are evicted while the stop save writes and at
            # its commit, during the old process's teardown, as in the spare path: nothing of the old world reads
            # them after the commit, and evicting after its exit delayed the new launch by 0.46 s of bench work.
            evicted_at = self.evict_through_commit(old, ckpt, deadline)
        self.wait(old, lambda _: old.proc.poll() is not None, deadline, "the preempted torchrun to exit")
        old_exited = time.time()
        t = time.perf_counter()
        cache = {"warm": "warm", "checkpoint": "fadvise"}.get(drop)
        if drop == "all":
            cache = recovery_limits.drop_page_cache(recovery_limits.checkpoint_files(ckpt))
        drop_s = time.perf_counter() - t
        # a new node: its own, empty memory folder (the preempted node's went with it)
        new = self.torchrun(
            phase,
            "replacement",
            ckpt,
            compile=compile,
            memory=self.memory(phase, "replacement"),
            env_extra=None if read_ahead else {ENV_READ_AHEAD: "0"},
        )
        self.first_step_after(new, None, deadline)
        new.stop()
        result = breakdown(old.events + new.events, sent)
        signal_at = result["signal_received_at"] or sent
        result.update(
            page_cache=cache,
            read_ahead=read_ahead,
            cache_drop_s=round(drop_s, 3),
            # fadvise: when the checkpoint's pages were evicted the last time, at the stop commit
            cache_evicted_s=None if evicted_at is None else round(evicted_at - signal_at, 3),
            # what the bench saw, seconds after the signal: the old torchrun gone (after its worker's exit event),
            # the new one launched (after the page cache drop)
            torchrun_exited_s=round(old_exited - signal_at, 3),
            torchrun_launched_s=round(new.launched_at - signal_at, 3),
            preempted_torchrun_exit_code=old.proc.returncode,
            launcher=launcher_moments(new.events, signal_at),
        )
        return result

    def spare(self, phase: str, deadline: float, *, compile: bool = False, at_notice: bool = False) -> dict:
        """The replacement path with a warm spare (spec.workers.spares: 1): a second launcher joins the rendezvous
        (a TCPStore server in this process, the coordinator's role) once the first trains, and waits in c10d's
        redundancy list with torch and the trainer imported; SIGTERM to the first: its stop save commits durably,
        its agent leaves the round, and the spare's round forms and forks its worker. The spare is a new node: its
        own memory folder, and the stop save's files leave the page cache as soon as they are committed.

        at_notice: no spare (spec.workers.spares: 0); the replacement's launcher starts together with the signal,
        as the operator creates the replacement pod once the lost one is deleting (planner/children.py), and
        imports and joins the rendezvous while the preempted worker saves."""
        from torch.distributed import TCPStore

        ckpt = Path(self.args.workdir) / phase / "ckpt"
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        run_id = f"bench-{phase}"
        rdzv = [
            "--nnodes=1:1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{store.port}",
            f"--rdzv-id={run_id}",
            "--rdzv-conf=is_host=0,last_call_timeout=1,join_timeout=600",
        ]
        old = self.torchrun(
            phase, "preempted", ckpt, compile=compile, memory=self.memory(phase, "preempted"), rdzv=rdzv
        )
        self.wait(old, lambda evs: of(evs, contract.EVENT_FIRST_STEP, rank=0), deadline, "training")
        name = "replacement" if at_notice else "spare"
        if not at_notice:
            new = self.torchrun(
                phase, name, ckpt, compile=compile, memory=self.memory(phase, name), rdzv=rdzv
            )
            # a spare is warm: it waits in the rendezvous and (ftjob's launcher) its forkserver has imported
            self.wait(
                new,
                lambda evs: (
                    (self.args.launcher != "ftjob" or of(evs, contract.EVENT_WARM_IMPORTS_DONE))
                    and new.proc.pid in waiting_agents(store, run_id)
                ),
                deadline,
                "the spare waiting, imported",
            )
        self.signal_point(old, deadline)
        sent = time.time()
        old.proc.send_signal(signal.SIGTERM)
        if at_notice:
            new = self.torchrun(
                phase, name, ckpt, compile=compile, memory=self.memory(phase, name), rdzv=rdzv
            )
        # the spare is another node: its reads must not hit this machine's page cache. A global drop after the
        # commit took ~1 s and could end after the spare started reading, so the stop save's pages are evicted
        # while it writes and at its commit.
        if self.args.warm_cache:
            self.wait(old, lambda evs: durable_stop_commit(evs), deadline, "the stop save's durable commit")
            cache, dropped = "warm", time.time()
        else:
            cache, dropped = "fadvise", self.evict_through_commit(old, ckpt, deadline)
        self.first_step_after(new, None, deadline)
        new.stop()
        exit_code = old.proc.wait(timeout=60)
        old.poll()  # its events after the durable commit (its exit), for the breakdown
        result = breakdown(old.events + new.events, sent)
        signal_at = result["signal_received_at"] or sent
        built = next(r["since_signal_s"] for r in result["breakdown"] if r["moment"] == "model_built")
        return result | {
            "page_cache": cache,
            "launched_s": round(new.launched_at - signal_at, 3) if at_notice else None,
            "launcher": launcher_moments(new.events, signal_at) | preempted_left(old.events, signal_at),
            "cache_dropped_s": round(dropped - signal_at, 3),
            # the drop is only meaningful if it came before the spare read the checkpoint (after its model build)
            "cache_dropped_before_load": cache == "warm"
            or (built is not None and dropped - signal_at <= built),
            "preempted_torchrun_exit_code": exit_code,
        }

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
        return {**breakdown(run.events, sent), "page_cache": "warm (same machine, not dropped)"}

    def limits(self, phase: str, deadline: float) -> dict:  # noqa: ARG002 - every phase takes its deadline
        a = self.args
        threads = a.read_threads
        return {
            "checkpoint_medium": recovery_limits.medium(Path(a.workdir) / "probe", a.probe_mb, threads),
            "dev_shm": recovery_limits.shm(a.probe_mb, threads),
            "imports": recovery_limits.imports(),
        }


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


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv, __doc__.split("\n\n")[0])
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
    if a.pycache_prefix:
        result["bytecode"] = recovery_limits.cache_bytecode(a.pycache_prefix)
        print(f"bytecode: {json.dumps(result['bytecode'])}", flush=True)
    phases = {
        "limits": bench.limits,
        "replacement": bench.replacement,
        "replacement_cold": lambda phase, deadline: bench.replacement(
            phase, deadline, drop="all", read_ahead=False
        ),
        "survivor": bench.survivor,
        "spare": bench.spare,
        "compile": lambda phase, deadline: bench.replacement(phase, deadline, compile=True),
        "spare_compile": lambda phase, deadline: bench.spare(phase, deadline, compile=True),
        "notice": lambda phase, deadline: bench.spare(phase, deadline, at_notice=True),
        "notice_compile": lambda phase, deadline: bench.spare(phase, deadline, compile=True, at_notice=True),
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
                # tens of GB at 1b, on disk and in /dev/shm (RAM): free them for the next phase
                shutil.rmtree(a.workdir / phase, ignore_errors=True)
                if a.memory_tier:
                    shutil.rmtree(Path(a.memory_tier) / phase, ignore_errors=True)
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
