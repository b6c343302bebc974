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

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from titanpod.kernels.jax_op import JaxOp, free_op_name, jax_op, pallas_interpret
from titanpod.kernels.mesh_split import batch_axes, head_axis
from titanpod.kernels.pallas_costs import with_cost_estimates
from titanpod.models import SequenceChunks, document_causal_mask

LANES = 128
"""Splash attention's tiles are whole multiples of the TPU's 128 lanes."""


@dataclass(frozen=True)
class SplashConfig:
    """Splash attention's mask and tiles."""

    block_q: int = 512
    """Query rows per tile (capped at the sequence length)."""
    block_kv: int = 512
    """Key/value rows per tile (capped at the sequence length)."""
    window: int | None = None
    """Local attention: each query sees itself and the ``window`` keys before it; ``None`` is plain causal."""
    interpret: bool | None = None
    """Run Pallas in interpret mode; ``None`` does so unless the tensors are on a TPU (see ``pallas_interpret``)."""
    causal: bool = True
    """``False``: no mask, every query sees every key (FLUX's joint text-image attention). A length that is not
    a multiple of the tiles is then padded up to one, the padded keys masked out; no window or document ids."""

    def __post_init__(self) -> None:
        if not self.causal and self.window is not None:
            raise ValueError(
                f"Splash attention without a causal mask has no local window (got window={self.window}); "
                "set kernels.window to None for a model whose attention is unmasked."
            )


def splash_tiles(config: SplashConfig, S: int, S_kv: int | None = None) -> tuple[int, int]:
    """``(block_q, block_kv)`` for ``S`` queries over ``S_kv`` keys (default ``S``): the configured tiles capped
    at each length; ``ValueError`` where the kernel cannot tile them (tiles must be multiples of ``LANES``
    and divide their lengths)."""
    S_kv = S if S_kv is None else S_kv
    block_q, block_kv = min(config.block_q, S), min(config.block_kv, S_kv)
    if S % block_q or S_kv % block_kv or block_q % LANES or block_kv % LANES:
        lengths = f"a sequence ({S})" if S_kv == S else f"query and key lengths ({S}, {S_kv})"
        raise ValueError(
            f"Splash attention needs tiles that are multiples of {LANES} and {lengths} that are multiples "
            f"of its tiles (block_q={block_q}, block_kv={block_kv}); change data.seq_len or "
            "kernels.splash's block sizes, or use attention 'sdpa'."
        )
    return block_q, block_kv


def full_splash_tiles(config: SplashConfig, S: int) -> tuple[int, int, int]:
    """``(padded length, block_q, block_kv)`` for unmasked attention over ``S`` tokens: each tile the configured
    one capped at ``S`` rounded up to ``LANES``, the length padded up to a multiple of both tiles."""
    if config.block_q % LANES or config.block_kv % LANES:
        raise ValueError(
            f"Splash attention needs tiles that are multiples of {LANES} (block_q={config.block_q}, "
            f"block_kv={config.block_kv}); change kernels.splash's block sizes."
        )
    lanes = -(-S // LANES) * LANES
    block_q, block_kv = min(config.block_q, lanes), min(config.block_kv, lanes)
    step = math.lcm(block_q, block_kv)
    return -(-S // step) * step, block_q, block_kv


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
            kernel = self._kernel(S, G, D, dtype.itemsize, documents, interpret, at)
            self._ops[key] = jax_op(name, kernel, shard=_per_shard)
        return self._ops[key]

    def _head_mask(self, S: int, at: tuple[SequenceChunks, SequenceChunks] | None) -> Any:
        """The kernel's mask of one head: causal (or local) over ``S``, or by the positions ``at`` gives."""
        import numpy as np
        from jax.experimental.pallas.ops.tpu import splash_attention as splash

        if not self.config.causal:  # padded keys (past S) masked out; the padded queries' rows are dropped
            S_pad = full_splash_tiles(self.config, S)[0]
            if S_pad == S:
                return splash.FullMask((S, S))
            return splash.NumpyMask(np.broadcast_to(np.arange(S_pad)[None, :] < S, (S_pad, S_pad)))
        if at is None:
            if self.config.window is None:
                return splash.CausalMask((S, S))
            return splash.LocalMask((S, S), window_size=(self.config.window, 0), offset=0)
        q_s = np.asarray(at[0].position_list())[:, None]
        k_S = np.asarray(at[1].position_list())[None, :]
        allowed_sS = k_S <= q_s
        if self.config.window is not None:
            allowed_sS &= k_S >= q_s - self.config.window
        return splash.NumpyMask(allowed_sS)

    def _kernel(
        self,
        S: int,
        G: int,
        D: int,
        itemsize: int,
        documents: bool,
        interpret: bool,
        at: tuple[SequenceChunks, SequenceChunks] | None,
    ) -> Any:
        import jax
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.tpu import splash_attention as splash

        S_q, S_kv = (S, S) if at is None else (at[0].length, at[1].length)
        S_pad = S_q
        if self.config.causal:
            block_q, block_kv = splash_tiles(self.config, S_q, S_kv)
        else:
            S_pad, block_q, block_kv = full_splash_tiles(self.config, S)
        tiles = splash.BlockSizes(
            block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
            block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
            block_q_dq=block_q, block_kv_dq=block_kv,
        )  # fmt: skip
        mask_GsS = splash.MultiHeadMask([self._head_mask(S, at)] * G)
        mqa, costs = splash_mqa_kernel(mask_GsS, tiles, D, itemsize, interpret)

        def one_call(q_GsD: Any, k_SD: Any, v_SD: Any, *ids: Any) -> Any:
            return mqa(q_GsD, k_SD, v_SD, splash.SegmentIds(*ids) if ids else None)

        kernel = with_cost_estimates(one_call, lambda name, _params: costs[splash_phase(name)])

        def attention(q_BHSD: Any, k_BKSD: Any, v_BKSD: Any) -> Any:
            B, K = k_BKSD.shape[:2]
            if S_pad != S_q:  # unmasked attention over a length the tiles do not divide: pad, then drop the pad
                pad = [(0, 0), (0, 0), (0, S_pad - S_q), (0, 0)]
                q_BHSD, k_BKSD, v_BKSD = (jnp.pad(x, pad) for x in (q_BHSD, k_BKSD, v_BKSD))
            q_BKGSD = (q_BHSD * (D**-0.5)).astype(q_BHSD.dtype).reshape(B, K, G, S_pad, D)
            out_BKGSD = jax.vmap(jax.vmap(kernel))(q_BKGSD, k_BKSD, v_BKSD)
            return out_BKGSD.reshape(B, K * G, S_pad, D)[:, :, :S_q]

        def attention_in_documents(q_BHSD: Any, k_BKSD: Any, v_BKSD: Any, ids_BS: Any) -> Any:
            return attention_over_documents(q_BHSD, k_BKSD, v_BKSD, ids_BS, ids_BS)

        def attention_over_documents(q_BHsD: Any, k_BKSD: Any, v_BKSD: Any, q_ids_Bs: Any, k_ids_BS: Any) -> Any:
            B, K = k_BKSD.shape[:2]
            q_BKGsD = (q_BHsD * (D**-0.5)).astype(q_BHsD.dtype).reshape(B, K, G, S_q, D)
            # Each row's ids become the kernel's segment ids, the same for every kv head of the row.
            per_kv_head = jax.vmap(kernel, in_axes=(0, 0, 0, None, None))
            out_BKGsD = jax.vmap(per_kv_head)(q_BKGsD, k_BKSD, v_BKSD, q_ids_Bs, k_ids_BS)
            return out_BKGsD.reshape(B, K * G, S_q, D)

        if not documents:
            return attention
        return attention_in_documents if at is None else attention_over_documents

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
        # int32 segment ids, relative to each row's smallest key id: "same document" stays exact.
        lowest_B1 = k_document_ids_BS.amin(dim=1, keepdim=True)
        q_ids = (q_document_ids_Bs - lowest_B1).to(torch.int32)
        return op(q_BHsD, k_BKSD, v_BKSD, q_ids, (k_document_ids_BS - lowest_B1).to(torch.int32))

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
        # The kernel's segment ids are int32; ids relative to each row's smallest keep "same document" exact.
        ids_BS = (document_ids_BS - document_ids_BS.amin(dim=1, keepdim=True)).to(torch.int32)
        return self._op(S, H // K, D, q_BHSD.dtype, True, q_BHSD.device)(q_BHSD, k_BKSD, v_BKSD, ids_BS)


SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
"""Block matmuls per visited tile in each of the kernel's Pallas calls: the forward QK^T and PV; the dq
kernel recomputes QK^T, then dP = dO V^T and dQ = dS K; the dkv kernel recomputes QK^T, then
dV = P^T dO, dP = dO V^T and dK = dS^T Q. The backward is 7/2 of the forward, not the 5/2 of a
fused flash backward: the two kernels each recompute QK^T and dP."""


def splash_phase(kernel_name: str) -> str:
    """``"fwd"``, ``"dq"`` or ``"dkv"``: which of Splash's Pallas calls ``kernel_name`` names
    (``splash_mqa_<phase>[_segmented]_[no_]residuals``); ``KeyError`` for any other kernel."""
    parts = kernel_name.split("_")
    if len(parts) < 3 or parts[0] != "splash" or parts[2] not in SPLASH_MATMULS:
        raise KeyError(f"{kernel_name!r} is not one of Splash attention's Pallas calls.")
    return parts[2]


def splash_mqa_kernel(mask: Any, tiles: Any, D: int, itemsize: int, interpret: bool) -> tuple[Any, dict[str, Any]]:
    """JAX's Splash kernel in its MQA form (one kv head and its G query heads, ``mask`` [G, S, S_kv])
    with its mask tables kept as numpy arrays, and the ``pl.CostEstimate`` of one call of each of its
    Pallas calls (``"fwd"``, ``"dq"``, ``"dkv"``), for ``D``-wide heads of ``itemsize`` bytes.

    ``make_splash_mqa_single_device`` builds the same kernel from the same tables but makes them
    device arrays (``jnp.array``): inside a trace they would be values of that trace (the kernel is
    built once and reused by every later trace: jit, grad, remat), and under the abstract mesh of an
    ahead-of-time compile for a TPU there is no device to put them on. Numpy tables are neither: each
    trace that calls the kernel takes them as constants, on whatever platform it compiles for.

    Costs count the work the kernel does: the tiles its tables visit (a causal mask's diagonal tiles
    whole, so a little over half of all tiles), ``SPLASH_MATMULS`` block matmuls of 2 x tile x tile x D
    flops each per query head, one exponential per visited score. Bytes: each query row tile read
    (and written) once per call, each visited tile's key/value (forward, dq) or query/dO (dkv) tiles
    read again; ids and mask tables left out.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mask_info

    G, S_q, S_kv = mask.shape
    tables = {
        "fwd": mask_info.process_mask(mask, (tiles.block_q, tiles.block_kv)),
        "dq": mask_info.process_mask(mask, (tiles.block_q_dq, tiles.block_kv_dq)),
        "dkv": mask_info.process_mask_dkv(mask, (tiles.block_q_dkv, tiles.block_kv_dkv)),
    }
    kernel = kernel_lib.SplashAttentionKernel(
        *(tables[phase][0] for phase in ("fwd", "dq", "dkv")),
        block_sizes=tiles, is_mqa=True, save_residuals=False, mask_value=kernel_lib.DEFAULT_MASK_VALUE,
        attn_logits_soft_cap=None, residual_checkpoint_name=None, mask_function=tables["fwd"][1],
        interpret=interpret,
    )  # fmt: skip
    blocks = {"fwd": (tiles.block_q, tiles.block_kv), "dq": (tiles.block_q_dq, tiles.block_kv_dq),
              "dkv": (tiles.block_q_dkv, tiles.block_kv_dkv)}  # fmt: skip
    q_rows, kv_rows, f32 = G * S_q * D * itemsize, S_kv * D * itemsize, 4
    costs = {}
    for phase, (info, _) in tables.items():
        block_mask = info.block_mask
        visited = int((block_mask != 0).sum()) * (G // block_mask.shape[0])  # tile tables shared by all G heads
        bq, bkv = blocks[phase]
        scores = visited * bq * bkv
        moved = {
            "fwd": 2 * q_rows + G * S_q * f32 + visited * 2 * bkv * D * itemsize,  # q in, out and lse out; k, v
            "dq": 3 * q_rows + 2 * G * S_q * f32 + visited * 2 * bkv * D * itemsize,  # q, dO, dq; lse, di; k, v
            "dkv": 4 * kv_rows + visited * (2 * bq * D * itemsize + 2 * bq * f32),  # k, v, dk, dv; q, dO, lse, di
        }[phase]
        costs[phase] = pl.CostEstimate(
            flops=SPLASH_MATMULS[phase] * 2 * scores * D, transcendentals=scores, bytes_accessed=moved
        )
    return kernel, costs


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
        S = q_BHSD.shape[2]
        i = torch.arange(S, device=q_BHSD.device)
        band_SS = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)
        # With ids: [B, 1, S, S], the band and the document mask.
        mask = band_SS if document_ids_BS is None else band_SS & document_causal_mask(document_ids_BS)
        return torch.nn.functional.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, attn_mask=mask, enable_gqa=True)

    return attention
