"""Positioned attention without a mask (flash per query chunk, merged by log-sum-exp) against SDPA with the
explicit positioned mask, forward and backward.

Tolerances: fp32 2e-5 (measured 4e-7 outputs, 7e-7 gradients); bf16 outputs 3e-2 and gradients 1.2e-1
(measured 3.9e-3 and 3.1e-2: bf16 rounding of the merged output before the backward).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from titanpod.models import SequenceChunks, positioned_sdpa_attention
from titanpod.models.common.chunked_attention import can_attend_in_chunks, chunked_causal_attention
from titanpod.models.common.sequence import positioned_causal_mask

TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (3e-2, 1.2e-1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cp", [2, 3])
def test_chunked_attention_matches_the_masked_reference_on_every_rank(dtype, cp):
    L, (B, H, K, D) = 32, (2, 4, 2, 16)
    generator = torch.Generator().manual_seed(cp)
    q, k, v = (torch.randn(B, h, 2 * cp * L, D, generator=generator).to(dtype) for h in (H, K, K))
    k_at = SequenceChunks(L, tuple(c for r in range(cp) for c in (r, 2 * cp - 1 - r)))  # the all-gather's order
    out_tol, grad_tol = TOLERANCE[dtype]
    for rank in range(cp):
        q_at = SequenceChunks(L, (rank, 2 * cp - 1 - rank))
        inputs = (q[:, :, q_at.positions()], k[:, :, k_at.positions()], v[:, :, k_at.positions()])
        assert can_attend_in_chunks(inputs[0], q_at, k_at)
        leaves = [x.clone().requires_grad_() for x in inputs]
        twins = [x.clone().requires_grad_() for x in inputs]
        got = chunked_causal_attention(*leaves, q_at, k_at)
        mask = positioned_causal_mask(q_at, k_at, q.device)
        want = F.scaled_dot_product_attention(*twins, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(got, want, atol=out_tol, rtol=out_tol)
        probe = torch.randn(want.shape, generator=generator).to(dtype)
        (got * probe).sum().backward()
        (want * probe).sum().backward()
        for a, b in zip(leaves, twins, strict=True):
            torch.testing.assert_close(a.grad, b.grad, atol=grad_tol, rtol=grad_tol)


def test_positioned_sdpa_takes_the_chunked_path_only_without_document_ids():
    q_at, k_at = SequenceChunks(8, (0, 3)), SequenceChunks(8, (0, 3, 1, 2))
    q, k, v = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 32, 8), torch.randn(1, 2, 32, 8)
    chunked = positioned_sdpa_attention(q, k, v, q_at, k_at)
    ids_B16, ids_B32 = torch.zeros(1, 16, dtype=torch.long), torch.zeros(1, 32, dtype=torch.long)
    masked = positioned_sdpa_attention(q, k, v, q_at, k_at, ids_B16, ids_B32)  # one document: the same attention
    torch.testing.assert_close(chunked, masked, atol=1e-6, rtol=1e-6)
    assert not can_attend_in_chunks(q, SequenceChunks(4, (0,)), k_at)  # chunks of another length
