"""Each kernel against the PyTorch reference it replaces, forward and backward, on the CPU.

Pallas kernels run in interpret mode. Tolerances (absolute and relative): fp32 2e-5 for
outputs and gradients; bf16 3e-2, about three bf16 ulps at the magnitudes tested.
Splash with document ids (segment ids) against document-masked SDPA, measured: fp32 outputs
3.6e-7 and gradients 1.7e-6 apart; bf16 outputs 7.8e-3 and gradients 3.1e-2 (the gradient
bound is 4x the tolerance).
"""

from __future__ import annotations

import pytest
import torch

from titanpod.kernels import (
    GroupedMatmulConfig,
    KernelConfig,
    MegabloxGroupedMatmul,
    PallasLinearCrossEntropy,
    PallasLossConfig,
    SplashAttention,
    SplashConfig,
    chunked_linear_cross_entropy,
    local_causal_sdpa,
    model_ops,
)
from titanpod.models import (
    IGNORE_INDEX,
    SequenceChunks,
    batched_expert_matmul,
    linear_cross_entropy,
    positioned_sdpa_attention,
    sdpa_attention,
)
from titanpod.models.common.ops import swiglu_experts

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
DTYPES = sorted(TOLERANCE, key=str)


def compare(kernel, reference, inputs, dtype):
    """Outputs and the gradients of a fixed random projection of them, kernel against reference."""
    tol = TOLERANCE[dtype]
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    twins = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    got, want = kernel(*leaves), reference(*twins)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    probe = torch.randn(want.shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    (got * probe).sum().backward()
    (want * probe).sum().backward()
    for a, b in zip(leaves, twins, strict=True):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, atol=tol * 4, rtol=tol)


def qkv(heads: int, kv_heads: int, dtype: torch.dtype, seq: int = 256, dim: int = 16):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, h, seq, dim, generator=g).to(dtype) for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 4), (4, 1)], ids=["gqa", "mha", "mqa"])
def test_splash_causal_matches_sdpa(dtype, heads, kv_heads):
    splash = SplashAttention(SplashConfig(block_q=128, block_kv=128))
    compare(splash, sdpa_attention, qkv(heads, kv_heads, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_splash_local_window_matches_banded_sdpa(dtype):
    splash = SplashAttention(SplashConfig(block_q=128, block_kv=128, window=40))
    compare(splash, local_causal_sdpa(40), qkv(4, 2, dtype), dtype)


def packed_document_ids(seq: int = 256) -> torch.Tensor:
    """Two rows of packed documents [2, S]: boundaries inside and across the 128-row tiles."""
    first = torch.repeat_interleave(torch.arange(4), torch.tensor([50, 100, 6, seq - 156]))
    second = torch.repeat_interleave(torch.tensor([3, 9]), torch.tensor([130, seq - 130]))  # ids need not start at 0
    return torch.stack([first, second])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_splash_with_document_ids_matches_document_masked_sdpa(dtype):
    splash = SplashAttention(SplashConfig(block_q=128, block_kv=128))
    compare(splash, sdpa_attention, [*qkv(4, 2, dtype), packed_document_ids()], dtype)


@pytest.mark.parametrize(
    ("dtype", "rank", "documents"),
    [(torch.float32, 0, False), (torch.float32, 1, True), (torch.bfloat16, 1, True)],
    ids=["float32-rank0-causal", "float32-rank1-documents", "bfloat16-rank1-documents"],
)
def test_positioned_splash_matches_positioned_sdpa(dtype, rank, documents):
    """Context parallelism's form: rank r of 2 holds chunks r and 3-r of a row of 4 chunks of 64 and
    attends over every rank's keys, laid out as the all-gather gives them (chunks 0, 3, 1, 2)."""
    q_at, k_at = SequenceChunks(64, (rank, 3 - rank)), SequenceChunks(64, (0, 3, 1, 2))
    q_BHSD, k_BKSD, v_BKSD = qkv(4, 2, dtype)
    q_rows, k_rows = q_at.positions(), k_at.positions()
    inputs = [q_BHSD[:, :, q_rows], k_BKSD[:, :, k_rows], v_BKSD[:, :, k_rows]]
    if documents:
        ids_BS = packed_document_ids()
        inputs += [ids_BS[:, q_rows], ids_BS[:, k_rows]]
    splash = SplashAttention(SplashConfig(block_q=128, block_kv=128))

    def positioned_splash(q, k, v, *ids):
        return splash.at_positions(q, k, v, q_at, k_at, *ids)

    def reference(q, k, v, *ids):
        return positioned_sdpa_attention(q, k, v, q_at, k_at, *ids)

    compare(positioned_splash, reference, inputs, dtype)


def test_positioned_sdpa_is_the_causal_attention_of_the_whole_row():
    """Every rank's positioned attention, put back in row order, is plain causal (and document) attention."""
    q_BHSD, k_BKSD, v_BKSD = qkv(4, 2, torch.float32)
    ids_BS = packed_document_ids()
    k_at = SequenceChunks(64, (0, 3, 1, 2))
    k_rows = k_at.positions()
    for ids in (None, ids_BS):
        whole = sdpa_attention(q_BHSD, k_BKSD, v_BKSD, ids)
        for rank in (0, 1):
            q_at = SequenceChunks(64, (rank, 3 - rank))
            q_rows = q_at.positions()
            given = () if ids is None else (ids[:, q_rows], ids[:, k_rows])
            got = positioned_sdpa_attention(
                q_BHSD[:, :, q_rows], k_BKSD[:, :, k_rows], v_BKSD[:, :, k_rows], q_at, k_at, *given
            )
            torch.testing.assert_close(got, whole[:, :, q_rows], atol=1e-6, rtol=1e-6)


def test_splash_local_window_with_document_ids_matches_banded_document_masked_sdpa():
    splash = SplashAttention(SplashConfig(block_q=128, block_kv=128, window=40))
    compare(splash, local_causal_sdpa(40), [*qkv(4, 2, torch.float32), packed_document_ids()], torch.float32)


def test_local_sdpa_with_document_ids_is_the_band_and_the_document_mask():
    q, k, v = qkv(2, 1, torch.float32, seq=12)
    ids = torch.tensor([[0] * 5 + [1] * 7] * 2)
    band = local_causal_sdpa(3)(q, k, v, ids)
    # The second document alone, with its own band: the same values as in the packed row.
    alone = local_causal_sdpa(3)(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:])
    torch.testing.assert_close(band[:, :, 5:], alone, atol=1e-6, rtol=0)
    # A window wider than every document: only the document mask is left.
    torch.testing.assert_close(local_causal_sdpa(20)(q, k, v, ids), sdpa_attention(q, k, v, ids), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_matmul_matches_the_batched_reference_with_empty_rows(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 7, 32, generator=g).to(dtype)  # 5 experts x 7 rows: not a whole number of tiles
    x[1, 3:] = 0  # rows an expert did not receive are zeros
    x[4] = 0
    w = torch.randn(5, 24, 32, generator=g).to(dtype)
    gmm = MegabloxGroupedMatmul(GroupedMatmulConfig(tile_rows=8, tile_in=16, tile_out=8))
    compare(gmm, batched_expert_matmul, [x, w], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_swiglu_matches_three_reference_matmuls_with_empty_rows(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 7, 32, generator=g).to(dtype)  # 4 experts x 7 rows: padded to whole tiles once
    x[2, 2:] = 0  # rows an expert did not receive are zeros, and must come out zero
    x[3] = 0
    w1, w3 = ((torch.randn(4, 24, 32, generator=g) * 0.3).to(dtype) for _ in range(2))
    w2 = (torch.randn(4, 32, 24, generator=g) * 0.3).to(dtype)
    gmm = MegabloxGroupedMatmul(GroupedMatmulConfig(tile_rows=8, tile_in=16, tile_out=8))
    compare(gmm.swiglu, swiglu_experts, [x, w1, w3, w2], dtype)
    assert not gmm.swiglu(x, w1, w3, w2)[3].any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunked_loss_matches_the_reference_with_ignored_labels(dtype):
    g = torch.Generator().manual_seed(3)
    h = torch.randn(3, 29, 16, generator=g).to(dtype)
    w = (torch.randn(300, 16, generator=g) * 0.3).to(dtype)
    labels = torch.randint(0, 300, (3, 29), generator=g)
    labels[0, :9] = IGNORE_INDEX
    labels[2, -3:] = IGNORE_INDEX
    chunked = lambda a, b, c: chunked_linear_cross_entropy(a, b, c, chunk_rows=10)  # noqa: E731 - 87 rows, uneven chunks
    compare(chunked, linear_cross_entropy, [h, w, labels], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pallas_loss_matches_the_reference_with_ignored_labels(dtype):
    g = torch.Generator().manual_seed(4)
    h = torch.randn(2, 37, 32, generator=g).to(dtype)  # 74 rows: padded to whole row tiles
    w = (torch.randn(300, 32, generator=g) * 0.3).to(dtype)  # 300 entries: padded and masked vocab tiles
    labels = torch.randint(0, 300, (2, 37), generator=g)
    labels[0, :7] = IGNORE_INDEX
    pallas = PallasLinearCrossEntropy(PallasLossConfig(block_rows=16, block_vocab=128))
    compare(pallas, linear_cross_entropy, [h, w, labels], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pallas_loss_with_a_vocabulary_inside_one_partial_tile_matches_the_reference(dtype):
    g = torch.Generator().manual_seed(5)
    h = torch.randn(1, 40, 32, generator=g).to(dtype)
    w = (torch.randn(100, 32, generator=g) * 0.3).to(dtype)  # 100 entries in one tile of 128: all of it partial
    labels = torch.randint(0, 100, (1, 40), generator=g)
    labels[0, -5:] = IGNORE_INDEX
    labels[0, 0] = 99  # the last entry of the vocabulary
    pallas = PallasLinearCrossEntropy(PallasLossConfig(block_rows=16, block_vocab=128))
    compare(pallas, linear_cross_entropy, [h, w, labels], dtype)


def test_chunked_loss_with_every_label_ignored_is_nan_like_the_reference():
    h, w = torch.randn(1, 4, 8), torch.randn(10, 8)
    labels = torch.full((1, 4), IGNORE_INDEX)
    assert torch.isnan(chunked_linear_cross_entropy(h, w, labels)) and torch.isnan(linear_cross_entropy(h, w, labels))


def test_unsupported_inputs_are_refused_not_miscomputed():
    with pytest.raises(ValueError, match=r"multiples of 128 and a sequence \(192\)"):
        SplashAttention(SplashConfig(block_q=128, block_kv=128))(*qkv(4, 2, torch.float32, seq=192))
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        SplashAttention()(*qkv(4, 2, torch.float16))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        SplashAttention()(*(qkv(4, 3, torch.float32)))
    with pytest.raises(ValueError, match=r"integer document ids of shape \[2, 256\]"):
        SplashAttention()(*qkv(4, 2, torch.float32), torch.zeros(2, 255, dtype=torch.long))
    with pytest.raises(TypeError, match="one dtype"):
        MegabloxGroupedMatmul()(torch.randn(2, 4, 4), torch.randn(2, 4, 4).bfloat16())
    with pytest.raises(TypeError, match="one dtype"):
        MegabloxGroupedMatmul().swiglu(*(torch.randn(2, 4, 4) for _ in range(3)), torch.randn(2, 4, 4).bfloat16())
    with pytest.raises(ValueError, match=r"down weights \[E, M, F\]"):
        MegabloxGroupedMatmul().swiglu(torch.randn(2, 3, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 4),
                                       torch.randn(2, 6, 4))  # fmt: skip
    with pytest.raises(TypeError, match="hidden states and head of one dtype"):
        PallasLinearCrossEntropy(PallasLossConfig())(
            torch.randn(1, 2, 4), torch.randn(5, 4).bfloat16(), torch.zeros(1, 2)
        )
    with pytest.raises(TypeError, match="integer token ids"):
        chunked_linear_cross_entropy(torch.randn(1, 2, 4), torch.randn(5, 4), torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"kernels\.attention must be one of sdpa, splash"):
        model_ops(KernelConfig(attention="flash"))
    with pytest.raises(ValueError, match=r"drop --kernels\.splash\.no-causal"):  # a decoder made unmasked, silently
        model_ops(KernelConfig(attention="splash", splash=SplashConfig(causal=False)))
    with pytest.raises(ValueError, match=r"drop --kernels\.splash\.fused-backward"):  # a setting of JAX's Splash
        model_ops(KernelConfig(attention="splash_sdpa", splash=SplashConfig(fused_backward=True)))
