"""Changing a named flavor's sizes from a recipe: the same architecture, narrower, shallower or with fewer experts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from titanpod.models.common.args import DecoderArgs

DECODER_SIZES = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size", "max_seq_len")
"""``ModelShape`` fields that replace the ``DecoderArgs`` field of the same name."""
EXPERT_SIZES = ("n_experts", "top_k", "expert_ffn_dim")
"""``ModelShape`` fields that replace the ``MoEArgs`` field of the same name."""


@dataclass(frozen=True)
class ModelShape:
    """Sizes that replace the flavor's; every field left ``None`` keeps the flavor's value.

    Everything else (GQA, q/k norms, tied head, RoPE and its scaling, routing rules) stays the
    flavor's, so a small shape runs the same arithmetic as the full model.
    """

    dim: int | None = None
    """Model (hidden) width."""
    n_layers: int | None = None
    """Number of transformer blocks."""
    n_heads: int | None = None
    """Query heads per attention layer."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); divides ``n_heads``."""
    head_dim: int | None = None
    """Width of one head."""
    ffn_dim: int | None = None
    """Hidden width of the dense feed-forward layer."""
    vocab_size: int | None = None
    """Rows of the embedding table and of the output head."""
    max_seq_len: int | None = None
    """Longest sequence the model is meant to see."""
    n_experts: int | None = None
    """Mixture-of-experts models: experts per layer."""
    top_k: int | None = None
    """Mixture-of-experts models: experts each token is sent to."""
    expert_ffn_dim: int | None = None
    """Mixture-of-experts models: hidden width of one expert."""

    def is_empty(self) -> bool:
        """Whether every size is the flavor's."""
        return all(getattr(self, f.name) is None for f in dataclasses.fields(self))

    def changed(self) -> dict[str, int]:
        """The sizes this shape sets, by field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def apply(self, args: DecoderArgs, where: str = "model.shape") -> DecoderArgs:
        """``args`` with this shape's sizes; ``ValueError`` names an expert size given for a dense model."""
        changed = self.changed()
        experts = {name: value for name, value in changed.items() if name in EXPERT_SIZES}
        if experts and args.moe is None:
            raise ValueError(
                f"{where}: {', '.join(sorted(experts))} apply to mixture-of-experts models only; this flavor is dense."
            )
        decoder = {name: value for name, value in changed.items() if name in DECODER_SIZES}
        moe = dataclasses.replace(args.moe, **experts) if experts else args.moe  # type: ignore[arg-type]
        return dataclasses.replace(args, **decoder, moe=moe)
