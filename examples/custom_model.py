"""Bring your own model and data to ftjob's trainer. Run it as written, from the repository root, after ./dev setup
(the folder holding `examples/` goes on PYTHONPATH):

    export PATH=$PWD/.venv/bin:$PATH
    PYTHONPATH=$PWD torchrun --nproc-per-node=2 -m ftjob_trainer.train \
        --model-factory examples.custom_model:make_model \
        --data-factory examples.custom_model:make_data \
        --seq-len 64 --global-batch-size 8 --steps 100 --checkpoint-dir /tmp/ckpt

Everything else works as with the built-in models: FSDP2 sharding, checkpoints, preemption saves, exact resume,
resharding. In a TrainingJob, the same two flags go into spec.trainer.flags (model-factory, data-factory) and the
module into the trainer image. tests/trainer/test_trainer_examples_and_data.py runs these flags, twice (a resume).

The model factory takes no arguments and returns an nn.Module that
  - maps LongTensor tokens [batch, seq] to logits [batch, seq, vocab_size],
  - has an int attribute `vocab_size`,
  - optionally lists the submodules FSDP2 shards one by one: `shard_units()` (else `layers`, else just the root),
  - optionally says its training FLOPs per token: `flops_per_token(seq_len)` (for MFU in the benchmark).
Build it deterministically: the trainer seeds torch before calling the factory, on every rank.

The data factory is called as make_data(seq_len, vocab_size, seed) and returns a map-style dataset (a
torch.utils.data.Dataset works): item i is a 1-D LongTensor of seq_len + 1 tokens (inputs plus next-token
targets). The trainer reads global index i as item i % len(dataset), so every rank can read any sample and a
resume at another world size continues the same stream: make item i depend only on i (and the seed).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class MixerBlock(nn.Module):
    """A causal token-mixing block (a masked linear map over positions) plus a channel MLP."""

    def __init__(self, dim: int, max_seq_len: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mix = nn.Parameter(torch.randn(max_seq_len, max_seq_len) * 0.02)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mix = torch.tril(self.token_mix[:t, :t])  # position j sees only positions <= j
        x = x + mix @ self.norm1(x)
        return x + self.mlp(self.norm2(x))


class MixerLM(nn.Module):
    def __init__(self, vocab_size: int = 512, dim: int = 96, n_layers: int = 3, max_seq_len: int = 256):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(MixerBlock(dim, max_seq_len) for _ in range(n_layers))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)

    def shard_units(self) -> list[nn.Module]:
        return list(self.layers)


def make_model() -> nn.Module:
    return MixerLM()


class CountingSequences(Dataset):
    """Sequences that count up by one from a start derived from the index: easy to learn, cheap to make."""

    def __init__(self, seq_len: int, vocab_size: int, seed: int, size: int = 100_000):
        self.seq_len, self.vocab_size, self.seed, self.size = seq_len, vocab_size, seed, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        start = (index * 7919 + self.seed) % self.vocab_size
        return (start + torch.arange(self.seq_len + 1)) % self.vocab_size


def make_data(seq_len: int, vocab_size: int, seed: int) -> Dataset:
    return CountingSequences(seq_len, vocab_size, seed)
