"""Splash attention's kernel as a JAX function, importing only JAX and numpy.

Legend: B batch, H query heads, K key/value heads, G query heads per key/value head,
S sequence, D head dim.

How the kernel is used, its masks and its costs are described in ``titanpod.kernels.splash``, the PyTorch
op that runs it; this module builds it (``splash_attention_fn``) so that it also builds where no PyTorch
is installed (``tools/bench/pallas_on_tpu.py`` on a TPU machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from titanpod.kernels.pallas_costs import with_cost_estimates

LANES = 128
"""Splash attention's tiles are whole multiples of the TPU's 128 lanes."""


@dataclass(frozen=True)
class SplashConfig:
    """Splash attention's mask and tiles.

    The tiles, ``interpret`` and ``fused_backward`` compute the same attention however they are set (field metadata
    ``same_maths``: a resumed run may change them; ``titanpod.models.field_checks``); the mask, ``window`` and
    ``causal``, decides what it computes.
    """

    block_q: int = field(default=512, metadata={"same_maths": True})
    """Query rows per tile (capped at the sequence length)."""
    block_kv: int = field(default=512, metadata={"same_maths": True})
    """Key/value rows per tile (capped at the sequence length)."""
    window: int | None = None
    """Local attention: each query sees itself and the ``window`` keys before it; ``None`` is plain causal."""
    interpret: bool | None = field(default=None, metadata={"same_maths": True})
    """Run Pallas in interpret mode; ``None`` does so unless the tensors are on a TPU (see ``pallas_interpret``)."""
    causal: bool = True
    """``False``: no mask, every query sees every key (FLUX's joint text-image attention). A length that is not
    a multiple of the tiles is then padded up to one, the padded keys masked out; no window or document ids."""
    fused_backward: bool = field(default=False, metadata={"same_maths": True})
    """One backward kernel for dq, dk and dv: 5 block matmuls a visited tile against the two kernels' 7 (each
    of those recomputes QK^T and dP), for a float32 dq per key tile held while it runs (B x H x S x D x 4 bytes
    x S / block_kv, one layer at a time)."""

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


def splash_head_mask(config: SplashConfig, S: int, at: tuple[Any, Any] | None = None) -> Any:
    """The kernel's mask of one head: causal (or local) over ``S``, unmasked (padded keys masked out), or by
    the positions ``at`` gives (two ``titanpod.models.SequenceChunks``: the queries' and the keys')."""
    import numpy as np
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    if not config.causal:  # padded keys (past S) masked out; the padded queries' rows are dropped
        S_pad = full_splash_tiles(config, S)[0]
        if S_pad == S:
            return splash.FullMask((S, S))
        return splash.NumpyMask(np.broadcast_to(np.arange(S_pad)[None, :] < S, (S_pad, S_pad)))
    if at is None:
        if config.window is None:
            return splash.CausalMask((S, S))
        return splash.LocalMask((S, S), window_size=(config.window, 0), offset=0)
    q_s = np.asarray(at[0].position_list())[:, None]
    k_S = np.asarray(at[1].position_list())[None, :]
    allowed_sS = k_S <= q_s
    if config.window is not None:
        allowed_sS &= k_S >= q_s - config.window
    return splash.NumpyMask(allowed_sS)


def splash_attention_fn(
    config: SplashConfig,
    S: int,
    G: int,
    D: int,
    itemsize: int,
    documents: bool,
    interpret: bool,
    at: tuple[Any, Any] | None = None,
) -> Any:
    """Splash attention over ``S`` tokens (or at the positions ``at``) as a JAX function, differentiable, with
    ``G`` query heads per key/value head of width ``D`` and ``itemsize`` bytes: ``(q_BHSD, k_BKSD, v_BKSD)``
    [B, H, S, D]; with ``documents``, also the int32 segment ids ``ids_BS`` (positioned: ``q_ids_Bs``,
    ``k_ids_BS``). Scaled by ``1/sqrt(D)``; in Pallas interpret mode when ``interpret``."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    S_q, S_kv = (S, S) if at is None else (at[0].length, at[1].length)
    S_pad = S_q
    if config.causal:
        block_q, block_kv = splash_tiles(config, S_q, S_kv)
    else:
        S_pad, block_q, block_kv = full_splash_tiles(config, S)
    dq_tiles = {} if config.fused_backward else {"block_q_dq": block_q, "block_kv_dq": block_kv}
    tiles = splash.BlockSizes(
        block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
        block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
        use_fused_bwd_kernel=config.fused_backward, **dq_tiles,
    )  # fmt: skip
    mask_GsS = splash.MultiHeadMask([splash_head_mask(config, S, at)] * G)
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


SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
"""Block matmuls per visited tile in each of the kernel's Pallas calls: the forward QK^T and PV; the dq
kernel recomputes QK^T, then dP = dO V^T and dQ = dS K; the dkv kernel recomputes QK^T, then
dV = P^T dO, dP = dO V^T and dK = dS^T Q. The backward is 7/2 of the forward, not the 5/2 of a
fused flash backward: the two kernels each recompute QK^T and dP (``SplashConfig.fused_backward``: one
kernel, its dkv call also computing dQ = dS K, ``FUSED_DKV_MATMULS``)."""
FUSED_DKV_MATMULS = 5
"""Block matmuls per visited tile of the fused backward kernel: QK^T, dP, dV, dK and dQ."""


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
    Pallas calls (``"fwd"``, ``"dq"``, ``"dkv"``; no ``"dq"`` with ``tiles.use_fused_bwd_kernel``), for ``D``-wide
    heads of ``itemsize`` bytes.

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
    fused = tiles.use_fused_bwd_kernel
    tables = {"fwd": mask_info.process_mask(mask, (tiles.block_q, tiles.block_kv))}
    if not fused:
        tables["dq"] = mask_info.process_mask(mask, (tiles.block_q_dq, tiles.block_kv_dq))
    tables["dkv"] = mask_info.process_mask_dkv(mask, (tiles.block_q_dkv, tiles.block_kv_dkv))
    kernel = kernel_lib.SplashAttentionKernel(
        *(tables[phase][0] if phase in tables else None for phase in ("fwd", "dq", "dkv")),
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
        matmuls = SPLASH_MATMULS[phase]
        if fused and phase == "dkv":  # and dq: a float32 partial per key tile, summed after the kernel
            matmuls, moved = FUSED_DKV_MATMULS, moved + (S_kv // bkv) * G * S_q * D * f32
        costs[phase] = pl.CostEstimate(flops=matmuls * 2 * scores * D, transcendentals=scores, bytes_accessed=moved)
    return kernel, costs
