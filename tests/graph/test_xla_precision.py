"""bf16 autocast on the xla lane: the torch functions torchax runs itself are cast like the aten matmuls."""

import pytest
import torch
import torch.nn.functional as F

torchax = pytest.importorskip("torchax")
from torchax import amp  # noqa: E402

from titanpod.graph.xla.precision import bf16_autocast  # noqa: E402


def test_projections_attention_and_einsum_run_in_bf16_and_the_table_is_restored():
    before = dict(amp.autocast_policy)
    env = torchax.default_env()
    with env:
        x = torch.randn(2, 4, 8, 16, device="jax")
        weight = torch.randn(32, 16, device="jax")
        with bf16_autocast():
            projected = F.linear(x, weight)
            attended = F.scaled_dot_product_attention(x, x, x, is_causal=True)
            contracted = torch.einsum("bhsd,ed->bhse", x, weight)
            joined = torch.cat((x, x.to(torch.bfloat16)), dim=-1)  # cat promotes by itself
        outside = F.linear(x, weight)
        error = (projected.float() - outside).abs().max().item() / outside.abs().max().item()
    assert (projected.dtype, attended.dtype, contracted.dtype) == (torch.bfloat16,) * 3
    assert joined.dtype == torch.float32
    assert outside.dtype == torch.float32
    assert 0 < error < 2e-2  # bf16 inputs: rounded, and no further
    assert amp.autocast_policy == before
