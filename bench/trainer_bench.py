"""Trainer benchmark (issue 3), side by side in one run, printed as JSON (and written to --out):

  1. engine tokens/s vs plain FSDP2 tokens/s (same model, data, optimizer; alternating rounds), MFU
  2. MFU with --compile
  3. training stall per periodic async save (the save call + the wait for staging before the next optimizer step)
  4. SIGTERM -> committed checkpoint, against state bytes / measured disk write bandwidth
  5. load time of the latest checkpoint at resume (page cache dropped for the checkpoint files first)

    python bench/trainer_bench.py --out DIR            # an H200: the 1b preset, batch 8 x 2048, bf16
    python bench/trainer_bench.py --out DIR --smoke    # any CPU, seconds: the tiny preset, proves the script runs
    python bench/trainer_bench.py --out DIR --hf-model same   # + the same sizes as a transformers Llama (hf:)

Runs as a world of one (or under torchrun). Checkpoints go to --workdir (not --out: they are large).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer_image"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ftjob_trainer import contract, events  # noqa: E402
from ftjob_trainer.checkpoint import Checkpointer  # noqa: E402
from ftjob_trainer.checkpoint_staging import STAGED_ASYNC  # noqa: E402
from ftjob_trainer.config import DataConfig, ModelConfig, OptimizerConfig, ParallelConfig  # noqa: E402
from ftjob_trainer.data import GlobalBatches, make_source  # noqa: E402
from ftjob_trainer.engine import Engine, build_model  # noqa: E402
from ftjob_trainer.preemption import NO_DEFICIT, StopSignals, agree  # noqa: E402
from ftjob_trainer.train import init_distributed  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

H200_BF16_DENSE_TFLOPS = 989.0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def trainer_events():
    """The trainer's structured events emitted inside the block (a list, filled when the block ends): the bench
    reads what the checkpointer reports from them, as the demo and the other benches do."""
    buf, found = io.StringIO(), []
    events.set_stream(buf)
    try:
        yield found
    finally:
        events.set_stream(None)
        found += contract.parse_events(buf.getvalue().splitlines())


def the_event(found: list[dict], name: str) -> dict:
    """The last event of that name (empty where this rank emits none: a commit is rank 0's)."""
    return next((e for e in reversed(found) if e["event"] == name), {})


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rank, self.world, _, self.device = init_distributed()
        self.data_cfg = DataConfig(seq_len=args.seq_len, global_batch_size=args.batch * self.world, seed=0)
        self.tokens_per_step = args.batch * self.world * args.seq_len
        self.peak = args.peak_tflops * 1e12 if self.device.type == "cuda" else None

    # --- builders ----------------------------------------------------------------------------------------------
    def engine(self, compile: bool = False, model: str | None = None) -> tuple[Engine, GlobalBatches]:
        mcfg = ModelConfig(name=model or self.args.model, compile=compile)
        model = build_model(mcfg, self.device, seed=0)
        eng = Engine(
            model,
            device=self.device,
            model_cfg=mcfg,
            opt_cfg=OptimizerConfig(warmup_steps=0),
            par_cfg=ParallelConfig(),
            total_steps=10_000,
        )
        batches = GlobalBatches(
            make_source(self.data_cfg, eng.vocab_size), self.data_cfg, self.rank, self.world
        )
        return eng, batches

    def plain(self):
        """Plain FSDP2: the same model, sharding and optimizer, and nothing else (no checks, no checkpointer)."""
        model = build_model(ModelConfig(name=self.args.model), self.device, seed=0)
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if self.device.type == "cuda"
            else MixedPrecisionPolicy()
        )
        for i, block in enumerate(model.layers):
            fully_shard(block, mp_policy=mp, reshard_after_forward=i < len(model.layers) - 1)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(
            model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True
        )
        return model, opt

    # --- timed loops -------------------------------------------------------------------------------------------
    def time_plain(self, model, opt, batches, first: int, steps: int) -> float:
        sync(self.device)
        t = time.perf_counter()
        for s in range(first, first + steps):
            for x, y in batches.micro_batches(s):
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync(self.device)
        return self.tokens_per_step * steps / (time.perf_counter() - t)

    def engine_step(self, eng: Engine, ckpt: Checkpointer | None, batches: GlobalBatches, step: int) -> None:
        """What train.py does every step: the step, commit a finished async save, the one-all-reduce agreement."""
        eng.train_step(
            batches.micro_batches(step), before_optimizer=ckpt.wait_for_staging if ckpt else lambda: None
        )
        if ckpt:
            ckpt.poll()
        agree(False, 0, NO_DEFICIT)

    def time_engine(self, eng, ckpt, batches, first: int, steps: int) -> float:
        sync(self.device)
        t = time.perf_counter()
        for s in range(first, first + steps):
            self.engine_step(eng, ckpt, batches, s)
        sync(self.device)
        return self.tokens_per_step * steps / (time.perf_counter() - t)

    def mfu(self, eng: Engine, tps: float) -> float | None:
        if self.peak is None or eng.flops_per_token is None:
            return None
        return tps * eng.flops_per_token(self.args.seq_len) / (self.peak * self.world)

    # --- the measurements ----------------------------------------------------------------------------------------
    def throughput(self) -> dict:
        a = self.args
        model, opt = self.plain()
        eng, batches = self.engine()
        ckpt = Checkpointer(None, 2, eng, self.rank, self.world)
        # --hf-model: the same loop on a transformers model, timed in the same alternation
        hf_eng, hf_batches = self.engine(model=f"hf:{a.hf_model}") if a.hf_model else (None, None)
        self.time_plain(model, opt, batches, 0, a.warmup)
        self.time_engine(eng, ckpt, batches, 0, a.warmup)
        if hf_eng:
            self.time_engine(hf_eng, None, hf_batches, 0, a.warmup)
        plain, engine, hf = [], [], []
        for r in range(a.rounds):  # alternate, so clock or thermal drift hits all alike
            first = a.warmup + r * a.steps
            plain.append(self.time_plain(model, opt, batches, first, a.steps))
            engine.append(self.time_engine(eng, ckpt, batches, first, a.steps))
            if hf_eng:
                hf.append(self.time_engine(hf_eng, None, hf_batches, first, a.steps))
        out = {
            "plain_fsdp2_tokens_per_s": statistics.median(plain),
            "engine_tokens_per_s": statistics.median(engine),
            "rounds": {"plain": plain, "engine": engine, **({"hf": hf} if hf_eng else {})},
        }
        if hf_eng:
            out["hf_model"] = a.hf_model
            out["hf_tokens_per_s"] = statistics.median(hf)
            out["hf_over_engine"] = out["hf_tokens_per_s"] / out["engine_tokens_per_s"]
            out["hf_flops_per_token"] = hf_eng.flops_per_token(a.seq_len) if hf_eng.flops_per_token else None
            out["hf_mfu"] = self.mfu(hf_eng, out["hf_tokens_per_s"])
        out["engine_over_plain"] = out["engine_tokens_per_s"] / out["plain_fsdp2_tokens_per_s"]
        # torchtitan's count: 6 x non-embedding params + attention scores; counting the embedding too (as the
        # issue's 56% reference does) gives about 6% more
        out["flops_per_token"] = eng.flops_per_token(a.seq_len) if eng.flops_per_token else None
        out["engine_mfu"] = self.mfu(eng, out["engine_tokens_per_s"])
        out["plain_mfu"] = self.mfu(eng, out["plain_fsdp2_tokens_per_s"])
        del model, opt, eng, ckpt, hf_eng
        self.free()
        return out

    def profile(self) -> dict:
        """Where an engine step's device time goes: the top kernels (to tell matmuls from everything else)."""
        from torch.profiler import ProfilerActivity, profile

        eng, batches = self.engine()
        self.time_engine(eng, None, batches, 0, 3)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            self.time_engine(eng, None, batches, 3, 3)
        key = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)
        total = sum(getattr(e, key, 0) for e in rows) or 1
        top = [
            {"name": e.key[:90], "share": getattr(e, key, 0) / total, "ms_per_step": getattr(e, key, 0) / 3e3}
            for e in rows[:25]
        ]
        del eng
        self.free()
        return {"sort": key, "top": top}

    def compiled(self) -> dict:
        a = self.args
        eng, batches = self.engine(compile=True)
        t = time.perf_counter()
        self.time_engine(eng, None, batches, 0, a.warmup)
        warm = time.perf_counter() - t
        tps = statistics.median(
            self.time_engine(eng, None, batches, a.warmup + r * a.steps, a.steps) for r in range(a.rounds)
        )
        out = {"compile_tokens_per_s": tps, "compile_mfu": self.mfu(eng, tps), "compile_warmup_seconds": warm}
        del eng
        self.free()
        return out

    def disk_write_bandwidth(self, root: Path) -> float:
        """Bytes/s of a large sequential write with fsync, in the checkpoint directory's file system."""
        size = self.args.disk_probe_mb << 20
        block = os.urandom(16 << 20)
        path = root / "disk-probe.bin"
        t = time.perf_counter()
        with open(path, "wb") as f:
            written = 0
            while written < size:
                written += f.write(block)
            f.flush()
            os.fsync(f.fileno())
        rate = written / (time.perf_counter() - t)
        path.unlink()
        return rate

    def checkpointing(self) -> dict:
        a = self.args
        root = Path(a.workdir) / "ckpt"
        shutil.rmtree(root, ignore_errors=True)
        eng, batches = self.engine()
        ckpt = Checkpointer(str(root), 2, eng, self.rank, self.world)
        step, warm_s, warm = 0, [], None
        for _ in range(a.warmup):
            self.engine_step(eng, ckpt, batches, step)
            if step == 0:
                warm = ckpt.warm_up()  # as train.py does after its first step
                if warm is not None:
                    t_warm = time.perf_counter()
                    warm.add_done_callback(lambda _, t0=t_warm: warm_s.append(time.perf_counter() - t0))
            step += 1
        step_times = []
        for _ in range(a.steps):
            sync(self.device)
            t = time.perf_counter()
            self.engine_step(eng, ckpt, batches, step)
            sync(self.device)
            step_times.append(time.perf_counter() - t)
            step += 1
        base = statistics.median(step_times)
        # a real run's first periodic save comes many steps in (--checkpoint-every), after the background warm-up
        # of the staging buffers; train on until it is done, as such a run would, and count the steps it took
        extra = 0
        while warm is not None and not warm.done() and extra < 1000:
            self.engine_step(eng, ckpt, batches, step)
            step += 1
            extra += 1
        # periodic async saves: stall = (save call + next step, which waits for staging) - a normal step
        stalls, commits = [], []
        for _ in range(a.saves):
            sync(self.device)
            t = time.perf_counter()
            ckpt.save(step, {"scheduler": eng.scheduler.state_dict()}, asynchronous=True)
            self.engine_step(eng, ckpt, batches, step)
            sync(self.device)
            stalls.append(time.perf_counter() - t - base)
            step += 1
            t_commit = time.perf_counter()
            while ckpt.inflight is not None:  # keep training until it commits, as a real run would
                self.engine_step(eng, ckpt, batches, step)
                step += 1
            commits.append(time.perf_counter() - t_commit)
        disk_bw = self.disk_write_bandwidth(root)
        state_bytes = ckpt.staging.state_bytes * self.world
        # SIGTERM -> committed: the signal lands as a step starts; the step ends, ranks agree, all save (sync)
        signals = StopSignals(["SIGUSR1"])
        os.kill(os.getpid(), signal.SIGUSR1)
        sync(self.device)
        self.engine_step(eng, ckpt, batches, step)
        step += 1
        agree(signals.received is not None, 0, NO_DEFICIT)
        with trainer_events() as stop_events:
            ckpt.save(step, {"scheduler": eng.scheduler.state_dict()}, kind=contract.KIND_STOP)
        sigterm_to_commit = time.monotonic() - signals.at
        committed = the_event(stop_events, contract.EVENT_CHECKPOINT_COMMITTED)
        phases = dict(ckpt.save_phases)
        signals.restore()
        ideal = state_bytes / disk_bw
        write_threads = ckpt.write_threads
        ckpt.close()  # releases the pinned staging buffers
        del eng, ckpt
        self.free()
        # load at resume: a fresh engine, page cache of the checkpoint dropped (as on a new node)
        drop_page_cache(root)
        eng, _ = self.engine()
        t = time.perf_counter()
        with trainer_events() as load_events:
            loaded = Checkpointer(str(root), 2, eng, self.rank, self.world).load_latest()
        sync(self.device)
        load_s = time.perf_counter() - t
        load = the_event(load_events, contract.EVENT_CHECKPOINT_LOADED)
        assert loaded is not None and loaded.step == step
        del eng
        self.free()
        shutil.rmtree(root, ignore_errors=True)
        return {
            "step_seconds": base,
            "staging_warm_up_seconds": warm_s[0] if warm_s else None,
            "steps_before_first_save": step,
            "async_save_stall_seconds": stalls,
            "async_save_stall_max_seconds": max(stalls),
            "async_save_background_seconds": commits,
            "staged_async_save": STAGED_ASYNC,
            "write_threads": write_threads,
            "state_bytes": state_bytes,
            "disk_write_bytes_per_s": disk_bw,
            "sigterm_to_commit_seconds": sigterm_to_commit,
            "sigterm_save_phases_seconds": phases,
            "sigterm_save_bytes": committed.get("bytes"),  # the committed directory's files, all ranks
            "ideal_write_seconds": ideal,
            "sigterm_to_commit_over_ideal": sigterm_to_commit / ideal,
            "load_seconds": load_s,
            # the checkpoint_loaded event: this rank's bytes of state and the read alone
            "load_bytes_per_rank": load.get("bytes"),
            "load_read_seconds": load.get("seconds"),
            "load_read_gbps_per_rank": load.get("gbps"),
        }

    def free(self) -> None:
        import gc

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def drop_page_cache(root: Path) -> None:
    """Ask the kernel to forget cached pages of the checkpoint files (they are fsynced, so this is allowed)."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def write_hf_llama_config(preset: str, folder: Path) -> str:
    """A transformers LlamaConfig with the preset's sizes (untied output, as the preset), for a like-for-like
    comparison of --model hf:... with the built-in model."""
    from ftjob_trainer.models import PRESETS

    p = PRESETS[preset]
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "llama",
        "hidden_size": p.dim,
        "num_hidden_layers": p.n_layers,
        "num_attention_heads": p.n_heads,
        "num_key_value_heads": p.n_heads,
        "intermediate_size": p.ffn_dim,
        "vocab_size": p.vocab_size,
        "rms_norm_eps": p.norm_eps,
        "rope_theta": p.rope_theta,
        "max_position_embeddings": p.max_seq_len,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return str(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for results.json")
    p.add_argument(
        "--smoke", action="store_true", help="tiny and quick: proves the script runs (CPU is fine)"
    )
    p.add_argument("--model", default=None, help="preset (default: 1b; smoke: tiny)")
    p.add_argument("--batch", type=int, default=None, help="samples per rank per step (default 8; smoke 2)")
    p.add_argument("--seq-len", type=int, default=None, help="default 2048; smoke 64")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5; smoke 1)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per round (default 20; smoke 2)")
    p.add_argument(
        "--rounds", type=int, default=None, help="alternating plain/engine rounds (default 3; smoke 1)"
    )
    p.add_argument(
        "--saves", type=int, default=None, help="periodic async saves to time (default 3; smoke 1)"
    )
    p.add_argument(
        "--disk-probe-mb", type=int, default=None, help="disk bandwidth probe size (default 4096; smoke 16)"
    )
    p.add_argument(
        "--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS, help="per-GPU dense bf16 peak for MFU"
    )
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile measurement")
    p.add_argument("--profile", action="store_true", help="add the top kernels of 3 engine steps")
    p.add_argument("--workdir", default=None, help="where checkpoints go (default: a temporary directory)")
    p.add_argument(
        "--hf-model",
        default=None,
        help="also time a transformers model (needs ftjob[hf]) in the throughput round: a model directory or "
        "config.json, or 'same' for the Llama config of --model's preset (written to --workdir)",
    )
    a = p.parse_args(argv)
    defaults = dict(
        model=("tiny", "1b"),
        batch=(2, 8),
        seq_len=(64, 2048),
        warmup=(1, 5),
        steps=(2, 20),
        rounds=(1, 3),
        saves=(1, 3),
        disk_probe_mb=(16, 4096),
    )
    for key, (smoke, full) in defaults.items():
        if getattr(a, key) is None:
            setattr(a, key, smoke if a.smoke else full)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    own_workdir = a.workdir is None
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="ftjob-bench-")
    if a.hf_model == "same":
        a.hf_model = write_hf_llama_config(a.model, Path(a.workdir) / f"hf-{a.model}")
    bench = Bench(a)
    try:
        result = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": torch.cuda.get_device_name()
            if torch.cuda.is_available()
            else platform.processor() or "cpu",
            "host": platform.node(),
            "torch": torch.__version__,
            "world_size": bench.world,
            "config": {
                k: getattr(a, k)
                for k in ("model", "batch", "seq_len", "steps", "rounds", "saves", "smoke", "hf_model")
            },
            "throughput": bench.throughput(),
            "compile": None if a.no_compile or a.smoke else bench.compiled(),
            "profile": bench.profile() if a.profile else None,
            "checkpoint": bench.checkpointing(),
        }
    finally:
        if own_workdir:
            shutil.rmtree(a.workdir, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()
    t, c = result["throughput"], result["checkpoint"]
    result["goals"] = {
        "engine_over_plain>=0.95": t["engine_over_plain"] >= 0.95,
        "compile_mfu>=0.60": None
        if not result["compile"] or result["compile"]["compile_mfu"] is None
        else result["compile"]["compile_mfu"] >= 0.60,
        "async_save_stall<=1s": c["async_save_stall_max_seconds"] <= 1.0,
        "sigterm_to_commit_over_ideal<=1.25": c["sigterm_to_commit_over_ideal"] <= 1.25,
    }
    if bench.rank == 0:
        (out / "results.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
