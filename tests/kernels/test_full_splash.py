"""Unmasked Splash attention (FLUX's joint attention) against unmasked SDPA, forward and backward, on the CPU.

Pallas runs in interpret mode. A length the tiles divide runs as is; a ragged one is padded up to the tiles
with the padded keys masked out. Tolerances are ``test_kernel_parity``'s: fp32 2e-5 on outputs (gradients
4x that absolute), bf16 3e-2.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_kernel_parity import compare
from titanpod.kernels import SplashAttention, SplashConfig
from titanpod.kernels.splash import full_splash_tiles
from titanpod.models.flux.ops import full_sdpa_attention


def qkv(seq: int, dtype: torch.dtype, heads: int = 2, dim: int = 32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(2, heads, seq, dim, generator=g).to(dtype) for _ in range(3)]


@pytest.mark.parametrize(
    ("dtype", "seq"),
    [(torch.float32, 256), (torch.float32, 300), (torch.bfloat16, 96)],
    ids=["fp32-tiled", "fp32-ragged", "bf16-one-ragged-tile"],
)
def test_unmasked_splash_matches_sdpa(dtype, seq):
    splash = SplashAttention(SplashConfig(block_q=128, block_kv=128, causal=False))
    compare(splash, full_sdpa_attention, qkv(seq, dtype), dtype)


def test_unmasked_splash_pads_to_a_multiple_of_both_tiles():
    assert full_splash_tiles(SplashConfig(causal=False), 512 + 4096) == (4608, 512, 512)  # FLUX.1 at 1024 px
    assert full_splash_tiles(SplashConfig(causal=False), 96) == (128, 128, 128)
    assert full_splash_tiles(SplashConfig(block_q=256, block_kv=512, causal=False), 700) == (1024, 256, 512)


def test_unmasked_splash_refuses_a_window_and_document_ids():
    with pytest.raises(ValueError, match=r"kernels\.window"):
        SplashConfig(window=16, causal=False)
    q, k, v = qkv(128, torch.float32)
    with pytest.raises(ValueError, match="no document ids"):
        SplashAttention(SplashConfig(causal=False))(q, k, v, torch.zeros(2, 128, dtype=torch.long))
