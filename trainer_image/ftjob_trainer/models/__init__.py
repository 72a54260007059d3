"""Built-in model sizes. Torch-free registry (the config validates --model against it); the module is in llama.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaArgs:
    dim: int
    n_layers: int
    n_heads: int
    ffn_dim: int
    vocab_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 4096


PRESETS: dict[str, LlamaArgs] = {
    # A few million parameters: multi-process CPU tests run it in seconds.
    "tiny": LlamaArgs(dim=128, n_layers=4, n_heads=4, ffn_dim=344, vocab_size=4096),
    "125m": LlamaArgs(dim=768, n_layers=12, n_heads=12, ffn_dim=2048, vocab_size=32000),
    # The benchmark size of issue 3 (about 0.95 B parameters with an untied output layer).
    "1b": LlamaArgs(dim=2048, n_layers=16, n_heads=16, ffn_dim=5632, vocab_size=32000),
}
