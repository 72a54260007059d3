"""Deterministic data addressed by a GLOBAL sample index.

Step s of the job consumes samples [s*B, (s+1)*B) of one endless stream (B = global batch size), whatever the
world size: rank r of W takes the r-th contiguous slice of B/W of them. The only data state is that cursor, so a
resume at another world size continues the very same stream.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Protocol

import torch

from ftjob_trainer.config import ConfigError, DataConfig


class SampleSource(Protocol):
    """What --data-factory returns: a map-style dataset (torch.utils.data.Dataset works) of 1-D LongTensors of
    seq_len + 1 tokens (inputs and the next-token targets). Global index i reads item i % len(source)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> torch.Tensor: ...


class SyntheticSource:
    """Learnable synthetic sequences: an arithmetic progression mod vocab with a random start and stride per
    sample, seeded by (seed, index) so any rank can produce any sample."""

    def __init__(self, seq_len: int, vocab_size: int, seed: int):
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed

    def __len__(self) -> int:
        return 2**62

    def __getitem__(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start = torch.randint(0, self.vocab_size, (1,), generator=g)
        stride = torch.randint(1, 8, (1,), generator=g)
        return (start + stride * torch.arange(self.seq_len + 1)) % self.vocab_size


class TokenFileSource:
    """Windows of seq_len + 1 tokens over a file: .bin = raw little-endian uint16 tokens (nanoGPT's format),
    anything else = text, tokenized by encode_text (an hf: model's tokenizer) if given, else read as UTF-8 bytes
    (byte-level tokens, vocab >= 256)."""

    def __init__(
        self, path: str, seq_len: int, vocab_size: int, encode_text: Callable[[str], list[int]] | None = None
    ):
        raw = open(path, "rb").read()
        if encode_text is not None and not path.endswith(".bin"):
            tokens = torch.tensor(encode_text(raw.decode("utf-8")), dtype=torch.int64)
        elif path.endswith(".bin"):
            if len(raw) % 2:
                raise ConfigError(
                    f"--data={path}: a .bin token file holds uint16 tokens; its size must be even"
                )
            tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint16).to(torch.int64)
        else:
            tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)
        if tokens.numel() < seq_len + 2:
            raise ConfigError(
                f"--data={path}: {tokens.numel()} tokens; need more than --seq-len + 1 = {seq_len + 1}"
            )
        top = int(tokens.max())
        if top >= vocab_size:
            raise ConfigError(
                f"--data={path}: token id {top} does not fit the model's vocabulary of {vocab_size}"
            )
        self.tokens, self.seq_len = tokens, seq_len
        self.windows = (tokens.numel() - 1) // seq_len

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, index: int) -> torch.Tensor:
        start = (index % self.windows) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]


def load_factory(ref: str, flag: str):
    mod_name, _, fn_name = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{flag}={ref!r}: cannot import it ({e}); is its folder on PYTHONPATH?") from e
    if not callable(fn):
        raise ConfigError(f"{flag}={ref!r} is not callable")
    return fn


def make_source(
    cfg: DataConfig, vocab_size: int, encode_text: Callable[[str], list[int]] | None = None
) -> SampleSource:
    if cfg.data_factory:
        src = load_factory(cfg.data_factory, "--data-factory")(cfg.seq_len, vocab_size, cfg.seed)
        if not hasattr(src, "__getitem__") or not hasattr(src, "__len__") or len(src) < 1:
            raise ConfigError(f"--data-factory={cfg.data_factory} must return a non-empty map-style dataset")
        return src
    if cfg.data == "synthetic":
        return SyntheticSource(cfg.seq_len, vocab_size, cfg.seed)
    return TokenFileSource(os.fspath(cfg.data), cfg.seq_len, vocab_size, encode_text)


class GlobalBatches:
    """The micro-batches rank `rank` of `world_size` trains on at a given step; stateless apart from the cursor."""

    def __init__(
        self,
        source: SampleSource,
        cfg: DataConfig,
        rank: int,
        world_size: int,
        base_step: int = 0,
        base_cursor: int = 0,
    ):
        cfg.check_world_size(world_size)
        self.source, self.cfg, self.rank, self.world_size = source, cfg, rank, world_size
        # where a resumed run picks the stream up (the checkpoint's cursor; steps before it may have had another B)
        self.base_step, self.base_cursor = base_step, base_cursor
        self.per_rank = cfg.global_batch_size // world_size
        self.micro = self.per_rank // cfg.grad_accum

    def cursor(self, step: int) -> int:
        """Global index of the first sample of step `step` (steps count from 0)."""
        return self.base_cursor + (step - self.base_step) * self.cfg.global_batch_size

    def sample(self, index: int) -> torch.Tensor:
        item = torch.as_tensor(self.source[index % len(self.source)], dtype=torch.long)
        if item.shape != (self.cfg.seq_len + 1,):
            raise ValueError(
                f"sample {index} has shape {tuple(item.shape)}; expected ({self.cfg.seq_len + 1},)"
            )
        return item

    def micro_batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        first = self.cursor(step) + self.rank * self.per_rank
        out = []
        for a in range(self.cfg.grad_accum):
            lo = first + a * self.micro
            batch = torch.stack([self.sample(i) for i in range(lo, lo + self.micro)])
            out.append((batch[:, :-1], batch[:, 1:]))
        return out
