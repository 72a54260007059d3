"""The built-in model's rotary embedding: the complex-multiply form rotates each (even, odd) pair by its
position's angle, exactly as the written-out formula does, in fp32 and for bf16 activations."""

from __future__ import annotations

import pytest
import torch
from ftjob_trainer.models.llama import apply_rope, rope_tables


def rotate_written_out(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_the_written_out_rotation(dtype):
    cos, sin = rope_tables(head_dim=16, max_seq_len=32, theta=10000.0)
    x = torch.randn(2, 32, 3, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    got = apply_rope(x, torch.complex(cos, sin))
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, rotate_written_out(x, cos, sin))
    # position 0 is the identity; a rotation keeps each pair's length
    torch.testing.assert_close(got[:, 0], x[:, 0])
    pairs = lambda t: t.float().unflatten(-1, (-1, 2)).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pairs(got), pairs(x), rtol=1e-2, atol=1e-2)
