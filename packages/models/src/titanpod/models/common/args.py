"""Shape and numerics of a decoder-only transformer: Llama 3, Qwen 3 and Qwen 3 MoE."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from titanpod.models.common.rope_scaling import Llama3RopeScaling


@dataclass(frozen=True)
class MoEArgs:
    """A sparse feed-forward layer: a router picks ``top_k`` of ``n_experts`` SwiGLU experts."""

    n_experts: int = 128
    """Experts per layer."""
    top_k: int = 8
    """Experts each token is sent to."""
    expert_ffn_dim: int = 768
    """Hidden width of one expert."""
    norm_topk_prob: bool = True
    """Renormalise the chosen experts' router probabilities to sum to one."""
    aux_loss_coef: float = 0.001
    """Weight of the load-balancing loss added to the training loss."""
    capacity_factor: float | None = None
    """Rows each expert takes per batch, as a multiple of its fair share: with N tokens a layer,
    capacity ``C = ceil(capacity_factor x N x top_k / n_experts)`` (at most N). A token's choice
    of an expert already holding C rows is dropped: it adds nothing, the residual carries the
    token on. First choices claim rows before second choices, and so on; within one rank of
    choice, earlier tokens first. ``None``: C = N, so no token is ever dropped (the routing of
    Hugging Face's Qwen 3 MoE), at the cost of experts computing over mostly empty rows."""

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be between 1 and n_experts ({self.n_experts}).")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(
                f"capacity_factor must be positive (or None for no dropped tokens), got {self.capacity_factor}."
            )


@dataclass(frozen=True)
class DecoderArgs:
    """Everything that fixes a decoder's parameters and arithmetic."""

    dim: int = 4096
    """Model (hidden) width."""
    n_layers: int = 32
    """Number of transformer blocks."""
    n_heads: int = 32
    """Query heads per attention layer."""
    n_kv_heads: int = 8
    """Key/value heads (grouped-query attention); divides ``n_heads``."""
    vocab_size: int = 128256
    """Rows of the embedding table and of the output head."""
    ffn_dim: int = 14336
    """Hidden width of the dense SwiGLU feed-forward layer (unused when ``moe`` is set)."""
    head_dim: int | None = None
    """Width of one head; ``None`` means ``dim // n_heads``."""
    norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    rope_theta: float = 500000.0
    """Base of the rotary frequencies."""
    rope_scaling: Llama3RopeScaling | None = None
    """Llama 3.1 long-context frequency scaling; ``None`` for plain RoPE."""
    max_seq_len: int = 8192
    """Longest sequence the model is meant to see (for planning; RoPE has no table)."""
    tie_embeddings: bool = False
    """Use the embedding table as the output head (no separate ``output`` weight)."""
    qk_norm: bool = False
    """RMSNorm each query and key head before RoPE (Qwen 3)."""
    moe: MoEArgs | None = None
    """Make every feed-forward layer a mixture of experts (Qwen 3 MoE)."""

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}).")
        if self.head_dim is None and self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads}) or set head_dim.")
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim ({self.resolved_head_dim}) must be even for rotary embeddings.")

    @property
    def resolved_head_dim(self) -> int:
        """The head width actually used."""
        return self.head_dim if self.head_dim is not None else self.dim // self.n_heads


def args_to_dict(args: DecoderArgs) -> dict[str, Any]:
    """``args`` as plain JSON-able data (``args_from_dict`` reverses it)."""
    return dataclasses.asdict(args)


def args_from_dict(data: dict[str, Any]) -> DecoderArgs:
    """Rebuild ``DecoderArgs`` from ``args_to_dict`` output; unknown fields are an error naming them."""
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(DecoderArgs)})
    if unknown:
        raise ValueError(f"Unknown model args fields: {', '.join(unknown)}.")
    values = dict(data)
    if values.get("rope_scaling") is not None:
        values["rope_scaling"] = Llama3RopeScaling(**values["rope_scaling"])
    if values.get("moe") is not None:
        values["moe"] = MoEArgs(**values["moe"])
    return DecoderArgs(**values)
