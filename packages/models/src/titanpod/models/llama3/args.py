"""Shape and numerics of a Llama 3 model."""

from __future__ import annotations

from dataclasses import dataclass

from titanpod.models.common.rope import Llama3RopeScaling


@dataclass(frozen=True)
class Llama3Args:
    """Everything that fixes a Llama 3 model's parameters and arithmetic."""

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
    """Hidden width of the SwiGLU feed-forward layer."""
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
    """Share the embedding table with the output head (Llama 3.2 1B and 3B)."""

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
