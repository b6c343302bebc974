"""The FLUX.1 transformer (rectified-flow MMDiT) in plain single-device PyTorch.

Legend: B batch, L image tokens, T text tokens, S joint sequence (S = T + L, text first),
C image token channels, P pooled text width, M model dim, H heads, D head dim, F sinusoid
channels, A position id axes (3). In ``txt_BTD`` the last axis is the text encoder's width
(``context_dim``), not a head dim.

Double-stream blocks keep separate weights for the text and the image tokens (modulation,
norms, q/k/v, output projection, MLP) and attend jointly over [text; image]. Single-stream
blocks run one fused linear (q, k, v and the MLP input) over the joined sequence and add
attention and MLP in parallel. Every block is modulated (shift, scale, gate) by one vector
per sample: timestep + guidance + pooled text embeddings.

Build on the meta device, move with ``to_empty``, then ``init_weights``. The attention op and the
block runner arrive as ``FluxOps``; parallelism, kernels and compilation are applied from outside.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titanpod.models.common.block_runner import carry_in_carry_out
from titanpod.models.common.init import ParamInit, init_parameters_
from titanpod.models.common.norms import RMSNorm
from titanpod.models.flux.args import FLUX_FLAVORS, FluxArgs
from titanpod.models.flux.counting import flux_flops_per_sample
from titanpod.models.flux.layers import (
    MLP,
    TIMESTEP_SCALE,
    MLPEmbedder,
    apply_pair_rotary,
    axes_rotary_cos_sin,
    layer_norm,
    modulate,
    timestep_embedding,
)
from titanpod.models.flux.ops import FluxOps, FullAttentionOp

_ZERO_STARTS = ("img_mod.", "txt_mod.", "modulation.", "final_layer.linear.")
"""Parameters (by part of their name) that start at zero: the adaLN modulations and the final projection."""


def _joint_attention(
    attention_op: FullAttentionOp,
    q_BHSD: torch.Tensor,
    k_BHSD: torch.Tensor,
    v_BHSD: torch.Tensor,
    cos_SD2: torch.Tensor,
    sin_SD2: torch.Tensor,
) -> torch.Tensor:
    """Rotate q and k, attend through the slot; returns [B, S, H x D]."""
    q_BHSD = apply_pair_rotary(q_BHSD, cos_SD2, sin_SD2)
    k_BHSD = apply_pair_rotary(k_BHSD, cos_SD2, sin_SD2)
    out_BHSD = attention_op(q_BHSD, k_BHSD, v_BHSD)
    return out_BHSD.transpose(1, 2).flatten(2)


class StreamAttention(nn.Module):
    """One stream's attention weights in a double-stream block: q/k/v, per-head q/k RMSNorm, output."""

    def __init__(self, args: FluxArgs) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.dim, bias=args.qkv_bias)
        self.wk = nn.Linear(args.dim, args.dim, bias=args.qkv_bias)
        self.wv = nn.Linear(args.dim, args.dim, bias=args.qkv_bias)
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps)
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps)
        self.wo = nn.Linear(args.dim, args.dim)

    def forward(self, x_BNM: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (RMS-normed per head, not yet rotated) and v, each [B, H, N, D]; ``wo`` is applied by the block
        after the joint attention."""
        B, N, _ = x_BNM.shape
        # Head counts come from the projections' widths, so a tensor-parallel shard runs the same code.
        q_BNHD = self.q_norm(self.wq(x_BNM).view(B, N, -1, self.head_dim))
        k_BNHD = self.k_norm(self.wk(x_BNM).view(B, N, -1, self.head_dim))
        v_BNHD = self.wv(x_BNM).view(B, N, -1, self.head_dim)
        return q_BNHD.transpose(1, 2), k_BNHD.transpose(1, 2), v_BNHD.transpose(1, 2)


class DoubleStreamBlock(nn.Module):
    """Text and image each keep their weights; attention runs once over [text; image]."""

    def __init__(self, args: FluxArgs, attention_op: FullAttentionOp) -> None:
        super().__init__()
        self.eps = args.norm_eps
        self.img_mod = nn.Linear(args.dim, 6 * args.dim)
        self.img_attn = StreamAttention(args)
        self.img_mlp = MLP(args.dim, args.mlp_dim)
        self.txt_mod = nn.Linear(args.dim, 6 * args.dim)
        self.txt_attn = StreamAttention(args)
        self.txt_mlp = MLP(args.dim, args.mlp_dim)
        self.attention_op = attention_op

    def forward(
        self,
        img_BLM: torch.Tensor,
        txt_BTM: torch.Tensor,
        vec_BM: torch.Tensor,
        cos_SD2: torch.Tensor,
        sin_SD2: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The updated (image, text) streams."""
        vec_BM = F.silu(vec_BM)
        # Each modulation gives (shift, scale, gate) for attention, then for the MLP.
        img_shift1, img_scale1, img_gate1, img_shift2, img_scale2, img_gate2 = self.img_mod(vec_BM).chunk(6, dim=-1)
        txt_shift1, txt_scale1, txt_gate1, txt_shift2, txt_scale2, txt_gate2 = self.txt_mod(vec_BM).chunk(6, dim=-1)

        img_q, img_k, img_v = self.img_attn(modulate(layer_norm(img_BLM, self.eps), img_shift1, img_scale1))
        txt_q, txt_k, txt_v = self.txt_attn(modulate(layer_norm(txt_BTM, self.eps), txt_shift1, txt_scale1))
        attended_BSM = _joint_attention(
            self.attention_op,
            torch.cat((txt_q, img_q), dim=2),
            torch.cat((txt_k, img_k), dim=2),
            torch.cat((txt_v, img_v), dim=2),
            cos_SD2,
            sin_SD2,
        )
        T = txt_BTM.shape[1]
        txt_attended_BTM, img_attended_BLM = attended_BSM[:, :T], attended_BSM[:, T:]

        img_BLM = img_BLM + img_gate1[:, None] * self.img_attn.wo(img_attended_BLM)
        img_BLM = img_BLM + img_gate2[:, None] * self.img_mlp(
            modulate(layer_norm(img_BLM, self.eps), img_shift2, img_scale2)
        )
        txt_BTM = txt_BTM + txt_gate1[:, None] * self.txt_attn.wo(txt_attended_BTM)
        txt_BTM = txt_BTM + txt_gate2[:, None] * self.txt_mlp(
            modulate(layer_norm(txt_BTM, self.eps), txt_shift2, txt_scale2)
        )
        return img_BLM, txt_BTM


class SingleStreamBlock(nn.Module):
    """One weight set over [text; image]: a fused q/k/v + MLP-in linear, attention and MLP in parallel."""

    def __init__(self, args: FluxArgs, attention_op: FullAttentionOp) -> None:
        super().__init__()
        self.eps = args.norm_eps
        self.dim, self.mlp_dim, self.head_dim = args.dim, args.mlp_dim, args.head_dim
        self.modulation = nn.Linear(args.dim, 3 * args.dim)
        self.linear1 = nn.Linear(args.dim, 3 * args.dim + args.mlp_dim)
        """Rows: q, k, v (``dim`` each), then the MLP's hidden layer (``mlp_dim``)."""
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps)
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps)
        self.linear2 = nn.Linear(args.dim + args.mlp_dim, args.dim)
        """Columns: the attention output (``dim``), then the MLP's activations (``mlp_dim``)."""
        self.attention_op = attention_op

    def forward(
        self, x_BSM: torch.Tensor, vec_BM: torch.Tensor, cos_SD2: torch.Tensor, sin_SD2: torch.Tensor
    ) -> torch.Tensor:
        """The updated joint sequence."""
        B, S, _ = x_BSM.shape
        shift, scale, gate = self.modulation(F.silu(vec_BM)).chunk(3, dim=-1)
        fused = self.linear1(modulate(layer_norm(x_BSM, self.eps), shift, scale))
        # Part widths follow the fused output's width: a tensor-parallel shard holds a share of each part.
        shares = (3 * self.dim + self.mlp_dim) // fused.shape[-1]
        q, k, v, mlp_hidden = torch.split(fused, [self.dim // shares] * 3 + [self.mlp_dim // shares], dim=-1)
        q_BHSD = self.q_norm(q.view(B, S, -1, self.head_dim)).transpose(1, 2)
        k_BHSD = self.k_norm(k.view(B, S, -1, self.head_dim)).transpose(1, 2)
        v_BHSD = v.view(B, S, -1, self.head_dim).transpose(1, 2)
        attended_BSM = _joint_attention(self.attention_op, q_BHSD, k_BHSD, v_BHSD, cos_SD2, sin_SD2)
        out_BSM = self.linear2(torch.cat((attended_BSM, F.gelu(mlp_hidden, approximate="tanh")), dim=-1))
        return x_BSM + gate[:, None] * out_BSM


class FinalLayer(nn.Module):
    """Adaptive LayerNorm (scale, then shift, from the conditioning vector) and the output projection."""

    def __init__(self, args: FluxArgs) -> None:
        super().__init__()
        self.eps = args.norm_eps
        self.modulation = nn.Linear(args.dim, 2 * args.dim)
        """Rows: scale (``dim``), then shift (``dim``)."""
        self.linear = nn.Linear(args.dim, args.resolved_out_channels)

    def forward(self, img_BLM: torch.Tensor, vec_BM: torch.Tensor) -> torch.Tensor:
        """[B, L, M] -> [B, L, C]."""
        scale, shift = self.modulation(F.silu(vec_BM)).chunk(2, dim=-1)
        return self.linear(modulate(layer_norm(img_BLM, self.eps), shift, scale))


class FluxTransformer(nn.Module):
    """FLUX.1's denoiser: predicts the flow (velocity) of every image token, given text and a timestep."""

    block_lists = ("double_blocks", "single_blocks")
    """The attributes holding the transformer blocks, in forward order: what a memory policy recomputes or
    offloads block by block, and a per-block step compiles one by one."""

    def __init__(self, args: FluxArgs, ops: FluxOps | None = None) -> None:
        super().__init__()
        self.args = args
        self.ops = ops or FluxOps()
        self.img_in = nn.Linear(args.in_channels, args.dim)
        self.txt_in = nn.Linear(args.context_dim, args.dim)
        self.time_in = MLPEmbedder(args.time_channels, args.dim)
        self.guidance_in = MLPEmbedder(args.time_channels, args.dim) if args.guidance_embed else None
        self.vector_in = MLPEmbedder(args.pooled_dim, args.dim)
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(args, self.ops.attention) for _ in range(args.depth))
        self.single_blocks = nn.ModuleList(
            SingleStreamBlock(args, self.ops.attention) for _ in range(args.depth_single)
        )
        self.final_layer = FinalLayer(args)

    def _check_inputs(
        self,
        img_BLC: torch.Tensor,
        img_ids_L3: torch.Tensor,
        txt_BTD: torch.Tensor,
        txt_ids_T3: torch.Tensor,
        timesteps_B: torch.Tensor,
        guidance_B: torch.Tensor | None,
    ) -> None:
        B, L, _ = img_BLC.shape
        T = txt_BTD.shape[1]
        axes = len(self.args.axes_dims)
        for name, ids, tokens in (("img_ids_L3", img_ids_L3, L), ("txt_ids_T3", txt_ids_T3, T)):
            if tuple(ids.shape) != (tokens, axes):
                raise ValueError(
                    f"{name} has shape {list(ids.shape)}; expected [{tokens}, {axes}]: one position id per token "
                    f"and rotary axis, shared by the batch (no batch dimension)."
                )
        if tuple(timesteps_B.shape) != (B,):
            raise ValueError(f"timesteps_B has shape {list(timesteps_B.shape)}; expected [{B}], one per sample.")
        if self.guidance_in is not None and guidance_B is None:
            raise ValueError("This FLUX model embeds a guidance scale (guidance_embed=True): pass guidance_B.")
        if self.guidance_in is None and guidance_B is not None:
            raise ValueError("This FLUX model has no guidance embedding (guidance_embed=False): drop guidance_B.")

    def conditioning(
        self, timesteps_B: torch.Tensor, pooled_BP: torch.Tensor, guidance_B: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """The per-sample vector [B, M] that modulates every block: timestep (+ guidance) + pooled text."""
        t_BF = timestep_embedding(timesteps_B.to(dtype) * TIMESTEP_SCALE, self.args.time_channels)
        vec_BM = self.time_in(t_BF.to(dtype))
        if self.guidance_in is not None and guidance_B is not None:
            g_BF = timestep_embedding(guidance_B.to(dtype) * TIMESTEP_SCALE, self.args.time_channels)
            vec_BM = vec_BM + self.guidance_in(g_BF.to(dtype))
        return vec_BM + self.vector_in(pooled_BP)

    def forward(
        self,
        img_BLC: torch.Tensor,
        img_ids_L3: torch.Tensor,
        txt_BTD: torch.Tensor,
        txt_ids_T3: torch.Tensor,
        timesteps_B: torch.Tensor,
        pooled_BP: torch.Tensor,
        guidance_B: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The predicted velocity of every image token, [B, L, C].

        ``img_BLC``: patched latents. ``img_ids_L3`` / ``txt_ids_T3``: integer position ids
        (index, row, column) of the image and text tokens, shared by the batch. ``txt_BTD``:
        text encoder states. ``timesteps_B``: t in [0, 1] (scaled by 1000 inside, as FLUX
        does). ``pooled_BP``: pooled text vector. ``guidance_B``: guidance scale, required
        exactly when the model embeds guidance (dev), also scaled by 1000.
        """
        self._check_inputs(img_BLC, img_ids_L3, txt_BTD, txt_ids_T3, timesteps_B, guidance_B)
        img_BLM = self.img_in(img_BLC)
        vec_BM = self.conditioning(timesteps_B, pooled_BP, guidance_B, img_BLM.dtype)
        txt_BTM = self.txt_in(txt_BTD)
        cos_SD2, sin_SD2 = axes_rotary_cos_sin(
            torch.cat((txt_ids_T3, img_ids_L3), dim=0), self.args.axes_dims, self.args.rope_theta
        )
        shared = (vec_BM, cos_SD2, sin_SD2)
        run = self.ops.block_runner
        (img_BLM, txt_BTM), _ = run(self.double_blocks, carry_in_carry_out, (img_BLM, txt_BTM), shared)
        T = txt_BTM.shape[1]
        (x_BSM,), _ = run(self.single_blocks, carry_in_carry_out, (torch.cat((txt_BTM, img_BLM), dim=1),), shared)
        return self.final_layer(x_BSM[:, T:], vec_BM)

    def parameter_init(self, name: str) -> ParamInit:
        """The law parameter ``name`` starts from (``titanpod.models.common.init``).

        adaLN-Zero, as DiT and torchtitan's FLUX: every modulation linear and the final
        projection start at zero, so each block starts as the identity and the output as
        zero. Other linear weights: a normal of std 0.02 truncated at 3 std; biases: zero;
        q/k norm scales: one.
        """
        if name.endswith("norm.weight"):
            return ParamInit("ones")
        if name.endswith(".bias") or any(part in name for part in _ZERO_STARTS):
            return ParamInit("zeros")
        return ParamInit("normal", std=0.02)

    def init_weights(self, seed: int = 0) -> None:
        """Initialise every parameter in place from ``seed``, on whatever device it lives.

        Each parameter's law is ``parameter_init``'s; values are drawn tile by tile on the CPU
        (``titanpod.models.common.init``), so the same seed gives the same weights on every
        device type, and ranks that initialise only their own shards get the same values too.
        """
        init_parameters_(self, seed)

    def flops_per_sample(self, image_tokens: int, text_tokens: int) -> float:
        """Training FLOPs for one sample; see ``titanpod.models.flux.counting`` for the convention."""
        return flux_flops_per_sample(self.args, image_tokens, text_tokens)


def build_flux_transformer(
    flavor: str | FluxArgs, ops: FluxOps | None = None, device: torch.device | str = "meta"
) -> FluxTransformer:
    """A FLUX transformer at a named flavor (``debug``, ``schnell``, ``dev``) or explicit args, uninitialised.

    On the meta device (the default) nothing is allocated; move with
    ``model.to_empty(device=...)`` and call ``model.init_weights(seed)``.
    """
    if isinstance(flavor, str):
        if flavor not in FLUX_FLAVORS:
            raise KeyError(f"Unknown FLUX flavor {flavor!r}; choose one of {', '.join(FLUX_FLAVORS)}.")
        flavor = FLUX_FLAVORS[flavor]
    with torch.device(device):
        return FluxTransformer(flavor, ops)
