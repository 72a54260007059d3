"""A Llama-style decoder as a pure nn.Module: RMSNorm, rotary embeddings, SDPA causal attention, SwiGLU.

No parallelism here (parallelize.py shards it). `layers` holds the blocks that FSDP2 shards one by one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ftjob_trainer.models import PRESETS, LlamaArgs


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    # x: [batch, seq, heads, head_dim]; rotate pairs (even, odd) by the position's angle: one complex multiply in
    # fp32 (freqs: [seq, head_dim / 2] unit complex numbers). Three kernels; the same rotation written out with
    # strided slices, four multiplies, two adds and a stack cost more memory traffic than any other
    # elementwise op of a bf16 step.
    xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(xc * freqs[None, :, None, :]).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.n_heads, self.head_dim = a.n_heads, a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, a.dim, bias=False)
        self.wv = nn.Linear(a.dim, a.dim, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self.wq(x).view(b, t, self.n_heads, self.head_dim), freqs)
        k = apply_rope(self.wk(x).view(b, t, self.n_heads, self.head_dim), freqs)
        v = self.wv(x).view(b, t, self.n_heads, self.head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn_dim, bias=False)
        self.w2 = nn.Linear(a.ffn_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.attention = Attention(a)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.feed_forward = FeedForward(a)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), freqs)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.args = a
        self.vocab_size = a.vocab_size
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = nn.RMSNorm(a.dim, eps=a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        cos, sin = rope_tables(a.dim // a.n_heads, a.max_seq_len, a.rope_theta)
        # Not persistent: derived from the config, so checkpoints hold only learned state.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    def init_buffers(self, device: torch.device) -> None:
        """Recompute the non-persistent buffers on `device` (a model built on meta and loaded from a checkpoint)."""
        a = self.args
        with device:  # computed where __init__ computes them (under build_model's device), so bitwise equal
            self.rope_cos, self.rope_sin = rope_tables(a.dim // a.n_heads, a.max_seq_len, a.rope_theta)

    @torch.no_grad()
    def init_weights(self) -> None:
        std = 0.02
        nn.init.normal_(self.tok_embeddings.weight, std=1.0)
        for i, block in enumerate(self.layers):
            depth_std = std / math.sqrt(
                2 * (i + 1)
            )  # smaller residual writes deeper down, as torchtitan does
            for lin in (block.attention.wq, block.attention.wk, block.attention.wv, block.feed_forward.w1):
                nn.init.trunc_normal_(lin.weight, std=std)
            for lin in (block.attention.wo, block.feed_forward.w2, block.feed_forward.w3):
                nn.init.trunc_normal_(lin.weight, std=depth_std)
        nn.init.trunc_normal_(self.output.weight, std=self.args.dim**-0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.args.max_seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds max_seq_len={self.args.max_seq_len}")
        freqs = torch.complex(
            self.rope_cos[:t], self.rope_sin[:t]
        )  # tables stay real: FSDP/.to() move them as is
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h, freqs)
        return self.output(self.norm(h))

    def shard_units(self) -> list[nn.Module]:
        """Submodules FSDP2 shards on their own (then the root), so one block's params are gathered at a time."""
        return list(self.layers)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x params (without embeddings) + attention scores (PaLM appendix B)."""
        a = self.args
        n = sum(p.numel() for p in self.parameters()) - a.vocab_size * a.dim
        return 6 * n + 12 * a.n_layers * a.dim * seq_len


def build(name: str) -> Transformer:
    return Transformer(PRESETS[name])
