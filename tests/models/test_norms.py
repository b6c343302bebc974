"""RMSNorm: float32 statistics, the result in the input's dtype."""

import torch

from titanpod.models.common.norms import RMSNorm


def norm_with_weight(dim: int) -> RMSNorm:
    norm = RMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=torch.Generator().manual_seed(1)))
    return norm


def test_a_float32_input_is_normed_as_hugging_faces_rmsnorm_bit_for_bit():
    norm, x = norm_with_weight(64), torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    want = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.equal(norm(x), want)


def test_a_bf16_input_stays_bf16_under_a_float32_weight():
    """Qwen 3's per-head norms under autocast: bf16 projections in, bf16 queries and keys out (a float32 result
    would double the bytes of the rotary embedding and the attention's inputs); the statistics stay float32."""
    norm = norm_with_weight(64)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = norm(x)
    assert got.dtype == torch.bfloat16
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(got, norm.weight.to(torch.bfloat16) * normed)
    got.float().sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32
