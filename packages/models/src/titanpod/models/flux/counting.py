"""Matmul parameters and model FLOPs of the FLUX.1 transformer, the numbers MFU is built on.

Convention (the LLM's, ``titanpod.models.common.counting``, applied per token stream):
training FLOPs for one sample = 6 x sum over matmul weights of (weight elements x the tokens
that weight multiplies) + 12 x (depth + depth_single) x n_heads x head_dim x S x S.

- Matmul weights are the ``nn.Linear`` weights; biases, norm scales and RoPE are left out.
- FLUX's weights do not all see the same tokens: the image stream's weights of a
  double-stream block multiply the L image tokens, the text stream's the T text tokens,
  single-stream blocks all S = T + L, and the conditioning weights (timestep, guidance
  and pooled-text MLPs, every adaptive-norm modulation) one vector per sample. Counting
  every parameter against every token (6 x N x S) would overstate FLUX.1 dev's FLOPs by
  two thirds at 1024 x 1024 pixels (L = 4096) with T = 512: over a quarter of its
  weights are modulation, and each stream's weights see only that stream's tokens.
- The attention term is scores and values, forward and backward (2 x 2 x 3), over the
  joint sequence with no mask: there is no causal halving, and no recompute is counted.
"""

from __future__ import annotations

from typing import NamedTuple

from titanpod.models.flux.args import FluxArgs


class FluxMatmulParams(NamedTuple):
    """``nn.Linear`` weight elements of a FLUX transformer, grouped by the tokens they multiply."""

    per_sample: int
    """Conditioning MLPs and modulation: one vector per sample."""
    image: int
    """Image input projection, the image stream of double blocks, the final projection: L tokens."""
    text: int
    """Text input projection and the text stream of double blocks: T tokens."""
    joint: int
    """Single-stream blocks: S = T + L tokens."""

    @property
    def total(self) -> int:
        """All matmul weight elements."""
        return self.per_sample + self.image + self.text + self.joint


def flux_matmul_params(args: FluxArgs) -> FluxMatmulParams:
    """The matmul weights of a FLUX transformer of shape ``args``, from the shape alone."""
    dim, mlp = args.dim, args.mlp_dim
    embedders = (args.time_channels * dim + dim * dim) * (2 if args.guidance_embed else 1)
    embedders += args.pooled_dim * dim + dim * dim
    modulation = args.depth * 2 * dim * 6 * dim + args.depth_single * dim * 3 * dim + dim * 2 * dim
    stream = 4 * dim * dim + 2 * dim * mlp  # q, k, v, out; MLP up and down
    single = dim * (3 * dim + mlp) + (dim + mlp) * dim
    return FluxMatmulParams(
        per_sample=embedders + modulation,
        image=args.in_channels * dim + args.depth * stream + dim * args.resolved_out_channels,
        text=args.context_dim * dim + args.depth * stream,
        joint=args.depth_single * single,
    )


def flux_flops_per_sample(args: FluxArgs, image_tokens: int, text_tokens: int) -> float:
    """Model FLOPs to train on one sample of ``image_tokens`` + ``text_tokens``: forward and backward.

    See this module's docstring for the convention.
    """
    params = flux_matmul_params(args)
    seq_len = image_tokens + text_tokens
    matmul = params.per_sample + params.image * image_tokens + params.text * text_tokens + params.joint * seq_len
    attention = 12.0 * (args.depth + args.depth_single) * args.n_heads * args.head_dim * seq_len * seq_len
    return 6.0 * matmul + attention
