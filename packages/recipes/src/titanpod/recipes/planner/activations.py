"""Activation memory of one transformer block and of the output head, measured on the meta device.

Legend: B batch, S sequence, M model dim, H heads, D head dim, N tokens (B x S), E experts,
K experts per token, F expert hidden dim, T routed rows (N x K), V vocabulary.

A block of the run's local shape (its tensor-parallel share of heads and widths, one
micro-batch of this device's sequences) runs forward on meta tensors: nothing is
allocated, and every tensor autograd keeps for the backward pass is recorded, each storage
once, parameters left out. Two parts are replaced by stand-ins with the same saved set:

- attention by a flash-style kernel (PyTorch's CPU flash SDPA, cuDNN/flash on GPUs,
  Splash on TPUs): it keeps q, k, v, the output and a per-row log-sum-exp, never S x S scores;
- a mixture-of-experts layer by perfectly balanced routing, since routing is data-dependent:
  each token's K copies go through one expert's SwiGLU (T rows, as the experts see in total).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from titanpod.models import DecoderArgs, ModelOps
from titanpod.models.common.moe import MoE, expert_capacity
from titanpod.models.common.rope import inverse_frequencies, rotary_cos_sin
from titanpod.models.common.transformer import TransformerBlock

MATMUL_OPS = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten._scaled_mm"})
"""Ops whose outputs the ``selective`` memory policy keeps (with attention outputs)."""


@dataclass(frozen=True)
class SavedBytes:
    """Bytes a region keeps for its backward pass, under each way of keeping them."""

    all_saved: int
    """Everything autograd saves (the ``save`` policy)."""
    matmul_saved: int
    """The part produced by matmuls and attention (what ``selective`` keeps)."""
    region_input: int
    """The region's input (what ``recompute`` and ``offload`` keep)."""
    recomputed: int | None = None
    """Working memory of running the region again in the backward (``recompute``), where a compiler fuses it
    to less than ``all_saved``; ``None``: ``all_saved``."""

    @property
    def recompute_bytes(self) -> int:
        """What recomputing the region in the backward holds at once."""
        return self.all_saved if self.recomputed is None else self.recomputed


class _FlashAttentionStandIn(torch.autograd.Function):
    """Saves what a flash-style attention kernel saves; the output's values do not matter on meta."""

    @staticmethod
    def forward(ctx: Any, q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor) -> torch.Tensor:
        out_BHSD = torch.empty_like(q_BHSD)
        lse_BHS = q_BHSD.new_empty(q_BHSD.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q_BHSD, k_BKSD, v_BKSD, out_BHSD, lse_BHS)
        return out_BHSD

    @staticmethod
    def backward(ctx: Any, grad_BHSD: torch.Tensor) -> Any:  # pragma: no cover - never run on meta
        raise RuntimeError("the planning stand-in for attention has no backward")


def flash_attention_stand_in(q_BHSD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor, *_: Any) -> torch.Tensor:
    """An attention op for planning on meta tensors: it saves what a flash-style kernel saves."""
    return _FlashAttentionStandIn.apply(q_BHSD, k_BKSD, v_BKSD)


class _BalancedMoEStandIn(nn.Module):
    """A mixture-of-experts layer whose experts compute over full buffers of their capacity (E x C rows,
    as the real layer does whatever the routing), and whose every token takes K of those rows back."""

    def __init__(self, moe: MoE) -> None:
        super().__init__()
        self.moe = moe

    def forward(self, x_BSM: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        moe, args = self.moe, self.moe.args
        x_NM = x_BSM.flatten(0, 1)
        logits_NE = moe.router(x_NM)
        probs_NE = F.softmax(logits_NE, dim=-1, dtype=torch.float32)
        weights_NK = probs_NE[:, : args.top_k] / probs_NE[:, : args.top_k].sum(dim=-1, keepdim=True)
        N = x_NM.shape[0]
        rows = args.n_experts * expert_capacity(N, args)
        buffers_RM = x_NM.repeat(-(-rows // N), 1)[:rows]
        experts = moe.experts
        hidden_RF = F.silu(F.linear(buffers_RM, experts.w1[0])) * F.linear(buffers_RM, experts.w3[0])
        done_RM = F.linear(hidden_RF, experts.w2[0])
        token_T = torch.arange(N, device=x_NM.device).repeat_interleave(args.top_k)
        routed_TM = done_RM[torch.arange(token_T.shape[0], device=x_NM.device) % rows]
        out_TM = routed_TM * weights_NK.flatten()[:, None].to(x_NM.dtype)
        dropped = torch.zeros((), dtype=torch.long, device=x_NM.device)
        return torch.zeros_like(x_NM).index_add_(0, token_T, out_TM).view_as(x_BSM), logits_NE, dropped


class _ProducerLog(TorchDispatchMode):
    """Remembers which op produced each storage.

    Storages are told apart by address, so it keeps every storage it has seen alive until it is dropped: a storage
    freed during the forward would otherwise lend its address to a later one, which would then be taken for the
    earlier op's output (and the figures would change from run to run with the allocator's reuse)."""

    def __init__(self) -> None:
        super().__init__()
        self.producer: dict[int, str] = {}
        self._seen: list[torch.UntypedStorage] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                key = _storage_key(value)
                if key not in self.producer:
                    self.producer[key] = name
                    self._seen.append(value.untyped_storage())
        return out


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def measure_saved_bytes(region: nn.Module, run: Any, region_input: torch.Tensor) -> SavedBytes:
    """Run ``run()`` (a forward through ``region``) and total what autograd saves."""
    excluded = {_storage_key(p) for p in region.parameters()}
    saved: dict[int, int] = {}
    attention: set[int] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key not in excluded:
            saved[key] = tensor.untyped_storage().nbytes()
        return tensor

    log = _ProducerLog()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), log:
        run()
    for key, producer in log.producer.items():
        if producer in ("aten.empty_like", "aten.new_empty") and key in saved:
            attention.add(key)  # the attention stand-in's output and log-sum-exp
    matmul = sum(size for key, size in saved.items() if log.producer.get(key) in MATMUL_OPS or key in attention)
    input_bytes = region_input.numel() * region_input.element_size()
    return SavedBytes(sum(saved.values()), matmul, input_bytes)


def local_args(args: DecoderArgs, tp: int) -> DecoderArgs:
    """The shape one tensor-parallel rank computes: its share of heads and feed-forward width."""
    if tp == 1:
        return args
    head_dim = args.resolved_head_dim
    return dataclasses.replace(
        args,
        n_heads=max(1, args.n_heads // tp),
        n_kv_heads=max(1, args.n_kv_heads // tp),
        head_dim=head_dim,
        ffn_dim=max(1, args.ffn_dim // tp),
    )


def block_saved_bytes(
    args: DecoderArgs,
    batch: int,
    seq_len: int,
    dtype: torch.dtype,
    tp: int = 1,
    sequence_parallel: bool = False,
    attention: Any = None,
) -> SavedBytes:
    """What one transformer block keeps for backward on one rank, for a micro-batch of ``batch`` sequences.

    Attention saves what a flash-style kernel saves, unless ``attention`` (an attention op that runs on meta
    tensors, e.g. ``kernels.attention math``'s, which keeps its score matrices) is given to count instead.

    With ``sequence_parallel`` the block input (the residual stream between tp regions) is
    split over the ``tp`` ranks; the rest is counted whole, so norms are over-counted a little.
    """
    shape = local_args(args, tp)
    with torch.device("meta"):
        block = TransformerBlock(shape, ModelOps(attention=attention or flash_attention_stand_in)).to(dtype)
        if isinstance(block.feed_forward, MoE):
            block.feed_forward = _BalancedMoEStandIn(block.feed_forward)
        x_BSM = torch.empty(batch, seq_len, shape.dim, dtype=dtype, requires_grad=True)
        inv_freq = inverse_frequencies(shape.resolved_head_dim, shape.rope_theta, shape.rope_scaling)
        cos_SD, sin_SD = rotary_cos_sin(torch.arange(seq_len), inv_freq, dtype)
    saved = measure_saved_bytes(block, lambda: block(x_BSM, cos_SD, sin_SD), x_BSM)
    if sequence_parallel and tp > 1:
        saved = dataclasses.replace(saved, region_input=saved.region_input // tp)
    return saved


def head_saved_bytes(args: DecoderArgs, batch: int, seq_len: int, dtype: torch.dtype, head_loss: Any) -> SavedBytes:
    """What the final norm, output projection and loss keep for backward, for one micro-batch."""
    from titanpod.models.common.norms import RMSNorm

    with torch.device("meta"):
        norm = RMSNorm(args.dim, args.norm_eps).to(dtype)
        weight_VM = nn.Parameter(torch.empty(args.vocab_size, args.dim, dtype=dtype))
        region = nn.ModuleDict({"norm": norm})
        region.register_parameter("head", weight_VM)
        h_BSM = torch.empty(batch, seq_len, args.dim, dtype=dtype, requires_grad=True)
        labels_BS = torch.zeros(batch, seq_len, dtype=torch.int64)
    return measure_saved_bytes(region, lambda: head_loss(norm(h_BSM), weight_VM, labels_BS), h_BSM)
