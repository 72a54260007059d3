"""Trainer configuration: one small dataclass per component, each validating itself with a fix-it error.

Every field that has a flag is also read from the environment: `--checkpoint-every` <- `FTJOB_CHECKPOINT_EVERY`
(the flag wins). `parse_args` is the only place that knows about argv and the environment.
Torch-free, so the operator's tests may import it to render worker arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftjob_trainer import contract

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}
HF_PREFIX = "hf:"  # --model hf:PATH: a transformers model (models/hf.py)
KNOWN_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")


class ConfigError(ValueError):
    """Bad flags or environment; the message says what to set. The trainer exits with EXIT_CONFIG_ERROR."""


def opt(default: Any, help: str, *, flag: str | None = None, kind: str | None = None) -> Any:
    """A dataclass field that is also a CLI flag (and FTJOB_* variable). `kind`: int|float|str|bool|opt_str."""
    return field(default=default, metadata={"help": help, "flag": flag, "kind": kind})


@dataclass
class ModelConfig:
    name: str = opt(
        "tiny",
        "built-in preset: tiny | 125m | 1b, or hf:PATH: a transformers causal LM's directory or config.json "
        "(pip install 'ftjob[hf]')",
        flag="--model",
    )
    model_factory: str | None = opt(
        None, "module:function returning your nn.Module (see examples/custom_model.py)", kind="opt_str"
    )
    compile: bool = opt(False, "torch.compile each transformer block")
    activation_checkpointing: bool = opt(False, "recompute each block's activations in backward")

    def __post_init__(self) -> None:
        from ftjob_trainer.models import PRESETS  # torch-free registry of sizes

        if self.model_factory is None and self.hf_path is not None:
            hf_model_dir(self.hf_path)  # the path is checked here; transformers where it is imported
            if importlib.util.find_spec("transformers") is None:
                raise ConfigError(
                    f"--model={self.name}: transformers is not installed; pip install 'ftjob[hf]' "
                    "(or: pip install transformers safetensors)"
                )
        elif self.model_factory is None and self.name not in PRESETS:
            raise ConfigError(
                f"--model={self.name!r} is not a preset; use one of {sorted(PRESETS)}, hf:PATH for a transformers "
                "model, or pass --model-factory module:function for your own model"
            )
        if self.model_factory is not None:
            _check_factory_ref("--model-factory", self.model_factory)

    @property
    def hf_path(self) -> str | None:
        """PATH of --model hf:PATH, else None."""
        return self.name[len(HF_PREFIX) :] if self.name.startswith(HF_PREFIX) else None


@dataclass
class DataConfig:
    data: str = opt(
        "synthetic", "'synthetic', or a path to a text file (.txt: bytes) or token file (.bin: uint16)"
    )
    data_factory: str | None = opt(
        None, "module:function(seq_len, vocab_size, seed) returning a map-style dataset", kind="opt_str"
    )
    seq_len: int = opt(128, "tokens per sample")
    global_batch_size: int = opt(8, "samples per optimizer step, over all ranks")
    grad_accum: int = opt(1, "micro-batches per rank per optimizer step")
    seed: int = opt(1234, "seed of the model init and the synthetic data")

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ConfigError(f"--seq-len must be >= 2 (got {self.seq_len})")
        if self.global_batch_size < 1 or self.grad_accum < 1:
            raise ConfigError("--global-batch-size and --grad-accum must be >= 1")
        if self.global_batch_size % self.grad_accum:
            raise ConfigError(
                f"--global-batch-size={self.global_batch_size} is not divisible by --grad-accum={self.grad_accum}"
            )
        if self.data_factory is not None:
            _check_factory_ref("--data-factory", self.data_factory)
        elif self.data != "synthetic" and not os.path.isfile(self.data):
            raise ConfigError(
                f"--data={self.data!r}: no such file; pass 'synthetic' or an existing .txt/.bin file"
            )

    def check_world_size(self, world_size: int) -> None:
        """Every rank gets the same number of samples; checked when the world size is known (it can change)."""
        per = world_size * self.grad_accum
        if self.global_batch_size % per:
            raise ConfigError(
                f"--global-batch-size={self.global_batch_size} must be divisible by world size x --grad-accum "
                f"= {world_size} x {self.grad_accum}; pick a multiple of every world size the job may run at"
            )


@dataclass
class OptimizerConfig:
    lr: float = opt(3e-4, "peak learning rate (AdamW)")
    min_lr_ratio: float = opt(0.1, "final learning rate as a fraction of --lr (cosine decay)")
    warmup_steps: int = opt(10, "linear warmup steps")
    weight_decay: float = opt(0.1, "AdamW weight decay")
    grad_clip: float = opt(1.0, "max global gradient norm; 0 disables clipping")

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"--lr must be > 0 (got {self.lr})")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"--min-lr-ratio must be within [0, 1] (got {self.min_lr_ratio})")
        if self.warmup_steps < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ConfigError("--warmup-steps, --grad-clip and --weight-decay must be >= 0")


@dataclass
class CheckpointConfig:
    checkpoint_dir: str | None = opt(
        None,
        "where committed checkpoints live (shared by all ranks): a folder, or an fsspec URL such as "
        "s3://bucket/prefix or gs://bucket/prefix (pip install 'ftjob[s3]' / 'ftjob[gcs]')",
        kind="opt_str",
    )
    checkpoint_every: int = opt(0, "save every N steps (0: only on preemption, request and at the end)")
    keep_last: int = opt(2, "committed checkpoints to keep (>= 1)")
    async_checkpoint: bool = opt(
        False, "periodic saves stage to (pinned) host memory and write in the background"
    )
    save_deadline_seconds: float = opt(
        25.0,
        "seconds a preemption save may take from the signal to commit (operator: grace period minus margin)",
    )
    write_threads: int = opt(
        8,
        "threads (and files) per rank that write a checkpoint: one stream rarely fills a disk",
        flag="--checkpoint-write-threads",
    )
    read_threads: int = opt(
        8,
        "threads per rank that read a checkpoint, one file each (its files: --checkpoint-write-threads per rank)",
        flag="--checkpoint-read-threads",
    )
    memory_checkpoint_dir: str | None = opt(
        None,
        "node-local folder (the pod's /dev/shm volume) that every save writes first; the durable copy in "
        "--checkpoint-dir follows in the background, and a restart in the same pod reads its files from here",
        kind="opt_str",
    )
    compile_cache: bool = opt(
        True,
        "with --compile: keep torch.compile's caches in <checkpoint-dir>/compile-cache (TORCHINDUCTOR_CACHE_DIR), "
        "so a restarted or replaced worker does not compile from scratch",
    )

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ConfigError(
                f"--keep-last={self.keep_last}: keep at least 1 committed checkpoint, or resume has nothing to load"
            )
        if self.checkpoint_every < 0:
            raise ConfigError(f"--checkpoint-every must be >= 0 (got {self.checkpoint_every})")
        if self.write_threads < 1 or self.read_threads < 1:
            raise ConfigError(
                "--checkpoint-write-threads and --checkpoint-read-threads must be >= 1 "
                f"(got {self.write_threads}, {self.read_threads})"
            )
        if is_url(self.checkpoint_dir):
            check_store_url(self.checkpoint_dir)
            if self.memory_checkpoint_dir:
                raise ConfigError(
                    "--memory-checkpoint-dir works with a folder --checkpoint-dir, not an object store URL yet; "
                    "unset it (FTJOB_MEMORY_CHECKPOINT_DIR)"
                )
        if self.memory_checkpoint_dir and not self.checkpoint_dir:
            raise ConfigError(
                "--memory-checkpoint-dir is the fast tier in front of --checkpoint-dir; set --checkpoint-dir too"
            )
        if self.save_deadline_seconds <= 0:
            raise ConfigError(f"--save-deadline-seconds must be > 0 (got {self.save_deadline_seconds})")
        if self.checkpoint_dir is None and (self.checkpoint_every or self.async_checkpoint):
            raise ConfigError(
                "--checkpoint-every/--async-checkpoint need --checkpoint-dir (or FTJOB_CHECKPOINT_DIR)"
            )


@dataclass
class ParallelConfig:
    cpu_offload: bool = opt(False, "FSDP2 CPUOffloadPolicy: FSDP keeps sharded params and grads on the CPU")
    param_offload: bool = opt(
        False, "move sharded params to the CPU between steps by hand (verl's param_offload)"
    )

    def __post_init__(self) -> None:
        if self.cpu_offload and self.param_offload:
            raise ConfigError(
                "--cpu-offload and --param-offload both move parameters; pick one (CPUOffloadPolicy owns placement)"
            )


@dataclass
class PreemptionConfig:
    stop_signals: str = opt("SIGTERM,SIGINT,SIGUSR1", "comma-separated signals that mean: save and stop")
    peer_stop_signals: str = opt(
        "SIGUSR2",
        "comma-separated signals that mean: a peer is going away, this pod stays; stop with it as its peers do (a "
        "rank stopped by another's signal), keeping this rank's files in the memory tier, and exit 75",
    )
    termination_log: str = opt(contract.DEFAULT_TERMINATION_LOG, "where the JSON termination message goes")
    coordinator_url: str | None = opt(
        None, "the coordinator's control API, e.g. http://10.96.0.12:29401", kind="opt_str"
    )
    poll_interval: float = opt(
        0.5,
        "seconds between rank 0's polls of the coordinator: a checkpoint request reaches the ranks up to this long "
        "(plus one step) after it is posted",
    )
    progress_every: int = opt(5, "rank 0 posts progress to the coordinator every N steps")

    def __post_init__(self) -> None:
        names = self.signal_names()
        bad = [n for n in names if n not in KNOWN_SIGNALS]
        if bad or not names:
            raise ConfigError(
                f"--stop-signals={self.stop_signals!r}: use a comma-separated subset of {KNOWN_SIGNALS}"
            )
        peer = self.peer_signal_names()
        if [n for n in peer if n not in KNOWN_SIGNALS] or set(peer) & set(names):
            raise ConfigError(
                f"--peer-stop-signals={self.peer_stop_signals!r}: a comma-separated subset of {KNOWN_SIGNALS} "
                f"not in --stop-signals ({','.join(names)})"
            )
        if self.poll_interval <= 0 or self.progress_every < 1:
            raise ConfigError("--poll-interval must be > 0 and --progress-every >= 1")

    def signal_names(self) -> list[str]:
        return [s.strip().upper() for s in self.stop_signals.split(",") if s.strip()]

    def peer_signal_names(self) -> list[str]:
        return [s.strip().upper() for s in self.peer_stop_signals.split(",") if s.strip()]


@dataclass
class RunConfig:
    steps: int = opt(100, "optimizer steps of the whole job (a resumed run continues to this count)")
    report: str | None = opt(
        None, "rank 0 keeps a JSON report here (atomic rewrites; state_sha256 at exit)", kind="opt_str"
    )
    log_every: int = opt(10, "log the loss every N steps (reading the loss syncs the device)")
    hash_on_load: bool = opt(
        False, "also put the state hash right after a resume into the report (loaded_state_sha256)"
    )

    def __post_init__(self) -> None:
        if self.steps < 1 or self.log_every < 1:
            raise ConfigError("--steps and --log-every must be >= 1")
        if self.report == "":
            self.report = None


@dataclass
class TrainConfig:
    model: ModelConfig
    data: DataConfig
    optimizer: OptimizerConfig
    checkpoint: CheckpointConfig
    parallel: ParallelConfig
    preemption: PreemptionConfig
    run: RunConfig


COMPONENTS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "checkpoint": CheckpointConfig,
    "parallel": ParallelConfig,
    "preemption": PreemptionConfig,
    "run": RunConfig,
}


def is_url(path: str | None) -> bool:
    """--checkpoint-dir s3://bucket/prefix (any fsspec URL) rather than a folder."""
    return bool(path) and "://" in path


def check_store_url(url: str) -> None:
    """The URL's fsspec protocol must be installed (s3fs for s3://, gcsfs for gs://)."""
    try:
        import fsspec
    except ImportError as e:
        raise ConfigError(f"--checkpoint-dir={url} needs fsspec (it comes with torch): {e}") from e
    protocol = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as e:
        raise ConfigError(
            f"--checkpoint-dir={url}: {e} (s3:// needs pip install 'ftjob[s3]', gs:// 'ftjob[gcs]')"
        ) from e


def hf_model_dir(path: str) -> Path:
    """The model directory of hf:PATH (PATH itself, or the folder of PATH=.../config.json), checked to hold a
    config.json."""
    p = Path(path)
    if not path or not (p.is_dir() and (p / "config.json").is_file() or p.is_file() and p.suffix == ".json"):
        raise ConfigError(
            f"--model=hf:{path}: give a transformers model directory holding config.json, or a config.json file"
        )
    return p if p.is_dir() else p.parent


def _check_factory_ref(flag: str, ref: str) -> None:
    mod, sep, fn = ref.partition(":")
    if not (sep and mod and fn):
        raise ConfigError(
            f"{flag}={ref!r}: write it as module:function, e.g. examples.custom_model:make_model"
        )


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def env_of(flag: str) -> str:
    return contract.ENV_FLAG_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def _kind(f: dataclasses.Field) -> str:
    if f.metadata.get("kind"):
        return f.metadata["kind"]
    return type(f.default).__name__  # int | float | str | bool


def _convert(kind: str, raw: str, where: str) -> Any:
    try:
        if kind == "bool":
            low = raw.strip().lower()
            if low in TRUE_WORDS:
                return True
            if low in FALSE_WORDS:
                return False
            raise ValueError
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "opt_str":
            return raw or None
        return raw
    except ValueError:
        want = {"bool": "one of 1/0/true/false/yes/no/on/off", "int": "an integer", "float": "a number"}[kind]
        raise ConfigError(f"{where}={raw!r}: expected {want}") from None


def all_flags() -> dict[str, str]:
    """flag -> env name, for every trainer flag (the public surface; a test pins it)."""
    return {flag_of(f): env_of(flag_of(f)) for cls in COMPONENTS.values() for f in dataclasses.fields(cls)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ftjob_trainer.train",
        description="ftjob trainer: FSDP2 training that saves on preemption and resumes exactly (run under torchrun).",
        epilog="Every flag --some-flag can also be set as FTJOB_SOME_FLAG; the flag wins.",
    )
    for comp, cls in COMPONENTS.items():
        group = p.add_argument_group(comp)
        for f in dataclasses.fields(cls):
            flag, kind = flag_of(f), _kind(f)
            dest = f"{comp}.{f.name}"
            helptext = f"{f.metadata['help']} [env {env_of(flag)}; default {f.default!r}]"
            if kind == "bool":
                group.add_argument(
                    flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=helptext
                )
            else:
                group.add_argument(
                    flag, dest=dest, default=None, help=helptext, metavar=kind.upper().replace("OPT_", "")
                )
    return p


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> TrainConfig:
    """Flags, then FTJOB_* environment, then defaults. Raises ConfigError with what to fix."""
    env = os.environ if env is None else env
    parser = build_parser()

    try:
        ns = vars(parser.parse_args(argv))
    except SystemExit as e:  # argparse already printed usage; --help exits 0
        if e.code in (0, None):
            raise
        raise ConfigError("bad command line (see the usage above)") from None
    parts: dict[str, Any] = {}
    for comp, cls in COMPONENTS.items():
        kwargs = {}
        for f in dataclasses.fields(cls):
            flag, kind = flag_of(f), _kind(f)
            value = ns[f"{comp}.{f.name}"]
            if value is not None:
                kwargs[f.name] = value if kind == "bool" else _convert(kind, value, flag)
            elif env_of(flag) in env:
                kwargs[f.name] = _convert(kind, env[env_of(flag)], env_of(flag))
        parts[comp] = cls(**kwargs)
    return TrainConfig(**parts)


def parse_args_quietly(argv: Sequence[str], env: Mapping[str, str] | None = None) -> TrainConfig | None:
    """The trainer's configuration as a process beside it reads it (the launcher): None, and nothing printed, for
    a command line the trainer will refuse with a message of its own."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return parse_args(argv, env)
    except (ConfigError, SystemExit, ValueError):
        return None


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
