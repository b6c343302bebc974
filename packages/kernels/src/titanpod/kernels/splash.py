"""Splash attention (JAX's Pallas TPU kernel) behind the model's attention slot.

Legend: B batch, H query heads, K key/value heads, G query heads per key/value head,
S sequence, D head dim.

The kernel runs per (batch, kv head) with the G query heads of that group (its MQA
form), under ``jax.vmap``; off a TPU it runs in Pallas interpret mode. One op is
registered per distinct (S, G, D, dtype, with or without document ids) the model meets.
Document ids (packed sequences) become the kernel's segment ids: its static mask (causal
or local) is and-ed with "same segment", one row of ids per batch element. The positioned
form (``at_positions``, used by context parallelism) attends queries at some chunks of a row
over keys at others, with the mask a static table built from their positions. On the xla
lane's mesh the kernel runs per shard: batch over the data axes, heads over ``tp`` when
it divides both head counts.

The kernel's mask tables are numpy arrays (``splash_mqa_kernel``), so building it needs no
device: it compiles by Mosaic for an abstract TPU mesh as well as in interpret mode. JAX's
Splash declares no cost estimates; titanpod declares them for each of its Pallas calls
(``titanpod.kernels.pallas_costs``), so a compiled step's ``cost_analysis`` counts attention:
per (batch, query head), forward 4 x D flops per visited score, backward 14 x D (its dq and
dkv kernels, ``SPLASH_MATMULS``), a visited score being one of a tile the mask does not rule
out (causal: a little over S^2 / 2, the diagonal tiles whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from titanpod.kernels.jax_custom_op import JaxOp, free_op_name, jax_op, pallas_interpret
from titanpod.kernels.math_attention import causal_mask
from titanpod.kernels.mesh_split import batch_axes, head_axis
from titanpod.kernels.pallas.splash_kernel import (
    LANES,
    SPLASH_MATMULS,
    SplashConfig,
    full_splash_tiles,
    splash_attention_fn,
    splash_mqa_kernel,
    splash_phase,
    splash_tiles,
)
from titanpod.models import SequenceChunks

__all__ = [
    "LANES",
    "SPLASH_MATMULS",
    "SplashAttention",
    "SplashConfig",
    "full_splash_tiles",
    "local_causal_sdpa",
    "splash_mqa_kernel",
    "splash_phase",
    "splash_tiles",
]


@dataclass
class SplashAttention:
    """Callable with the ``AttentionOp`` signature: causal (optionally local) GQA attention,
    kept within packed documents when given document ids (the kernel's segment ids); or, configured
    with ``causal=False``, unmasked attention (FLUX's ``FullAttentionOp``)."""

    config: SplashConfig = field(default_factory=SplashConfig)
    """Mask and tiles."""
    _ops: dict[tuple[Any, ...], JaxOp] = field(default_factory=dict, repr=False)

    def _op(
        self,
        S: int,
        G: int,
        D: int,
        dtype: torch.dtype,
        documents: bool,
        device: torch.device,
        at: tuple[SequenceChunks, SequenceChunks] | None = None,
    ) -> JaxOp:
        interpret = pallas_interpret(self.config.interpret, device)
        key = (S, G, D, dtype, documents, interpret, at)
        if key not in self._ops:
            shape = f"{S}_{G}_{D}" if at is None else f"{at[0].length}x{at[1].length}_{G}_{D}_positioned"
            shape += "" if self.config.causal else "_full"
            name = free_op_name(f"splash_{shape}_{str(dtype).split('.')[-1]}{'_documents' if documents else ''}")
            kernel = splash_attention_fn(self.config, S, G, D, dtype.itemsize, documents, interpret, at)
            self._ops[key] = jax_op(name, kernel, shard=_per_shard)
        return self._ops[key]

    def at_positions(
        self,
        q_BHsD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        q_at: SequenceChunks,
        k_at: SequenceChunks,
        q_document_ids_Bs: torch.Tensor | None = None,
        k_document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The positioned form (``titanpod.models.PositionedAttentionOp``): queries at ``q_at``'s row positions
        over keys at ``k_at``'s, causal (or local) by position, within documents when given their ids. The
        mask is a static table per (``q_at``, ``k_at``), so the kernel skips the tiles it rules out."""
        H, s, D = q_BHsD.shape[1:]
        K, S = k_BKSD.shape[1], k_BKSD.shape[2]
        _check_heads_and_dtype(H, K, q_BHsD.dtype)
        if not self.config.causal:
            raise ValueError("Positioned splash attention is causal by position; this one is configured unmasked.")
        if (s, S) != (q_at.length, k_at.length):
            raise ValueError(f"Positioned splash attention got {s} queries and {S} keys for {q_at} and {k_at}.")
        op = self._op(S, H // K, D, q_BHsD.dtype, q_document_ids_Bs is not None, q_BHsD.device, (q_at, k_at))
        if q_document_ids_Bs is None or k_document_ids_BS is None:
            return op(q_BHsD, k_BKSD, v_BKSD)
        q_ids_Bs = _segment_ids(q_document_ids_Bs, k_document_ids_BS)
        return op(q_BHsD, k_BKSD, v_BKSD, q_ids_Bs, _segment_ids(k_document_ids_BS, k_document_ids_BS))

    def __call__(
        self,
        q_BHSD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal (or local) GQA attention [B, H, S, D]; with ``document_ids_BS``, only within each document.
        Configured unmasked (``causal=False``): every query over every key, the ``FullAttentionOp`` of FLUX."""
        B, H, S, D = q_BHSD.shape
        K = k_BKSD.shape[1]
        _check_heads_and_dtype(H, K, q_BHSD.dtype)
        if document_ids_BS is None:
            return self._op(S, H // K, D, q_BHSD.dtype, False, q_BHSD.device)(q_BHSD, k_BKSD, v_BKSD)
        if not self.config.causal:
            raise ValueError(
                "Unmasked splash attention (SplashConfig.causal=False) takes no document ids: every query sees every "
                "key. Keep documents apart with causal splash attention, or do not pass document ids."
            )
        if tuple(document_ids_BS.shape) != (B, S) or document_ids_BS.is_floating_point():
            raise ValueError(
                f"Splash attention needs integer document ids of shape [{B}, {S}] (one per token), "
                f"got {document_ids_BS.dtype} {list(document_ids_BS.shape)}."
            )
        ids_BS = _segment_ids(document_ids_BS, document_ids_BS)
        return self._op(S, H // K, D, q_BHSD.dtype, True, q_BHSD.device)(q_BHSD, k_BKSD, v_BKSD, ids_BS)


def _segment_ids(document_ids: torch.Tensor, key_document_ids_BS: torch.Tensor) -> torch.Tensor:
    """The kernel's int32 segment ids for ``document_ids`` (a row's queries, [B, s], or its keys, [B, S]): each
    relative to its row's smallest key id, so "same document" stays exact however large the ids are."""
    return (document_ids - key_document_ids_BS.amin(dim=1, keepdim=True)).to(torch.int32)


def _check_heads_and_dtype(H: int, K: int, dtype: torch.dtype) -> None:
    if H % K:
        raise ValueError(f"Splash attention needs query heads ({H}) to be a multiple of key/value heads ({K}).")
    if dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"Splash attention runs in float32 or bfloat16, not {dtype}.")


def _per_shard(fn: Any, mesh: Any, q_BHSD: Any, k_BKSD: Any, _v_BKSD: Any, *ids_BS: Any) -> Any:
    """``fn`` under ``jax.shard_map`` on ``mesh``: batch over the data axes, heads over tp when it
    divides them; an axis that divides neither leaves every shard the whole of that dimension."""
    import jax
    from jax.sharding import PartitionSpec as P

    batch = batch_axes(mesh, q_BHSD.shape[0])
    heads = head_axis(mesh, q_BHSD.shape[1], k_BKSD.shape[1])
    rows_HSD = P(batch, heads, None, None)
    in_specs = (rows_HSD, rows_HSD, rows_HSD, *(P(batch, None) for _ in ids_BS))
    # check_vma=False: Pallas outputs carry no record of which mesh axes they vary over.
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=rows_HSD, check_vma=False)


def local_causal_sdpa(window: int):
    """Reference for local attention: SDPA with an explicit band mask (query i sees keys i-window..i).

    The returned op has the ``AttentionOp`` signature; given ``document_ids_BS`` it also keeps
    each query within its own document (band and same document).
    """

    def attention(
        q_BHSD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        mask = causal_mask(q_BHSD.shape[2], q_BHSD.device, window, document_ids_BS)
        return torch.nn.functional.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, attn_mask=mask, enable_gqa=True)

    return attention
