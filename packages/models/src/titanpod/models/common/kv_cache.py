"""A preallocated key/value cache for incremental decoding, and the attention that reads it.

Legend: B batch, S new tokens in this call, T cached positions attended over (``end``),
H query heads, K key/value heads, D head dim, L layers.

Every row of the batch has its own length: row ``b`` holds valid keys and values at cache
positions ``0 .. lengths_B[b] - 1``, and the next tokens it is given sit at absolute
positions ``lengths_B[b], lengths_B[b] + 1, ...`` (RoPE uses these positions). A query at
position ``p`` attends to cache positions ``0 .. p`` of its own row, so whatever lies past a
row's length (padding written by a right-padded prefill, or nothing yet) is never read; it
is overwritten when the row reaches it. This is how prompts of different lengths share one
batch: right-pad them, prefill from position 0, then ``set_lengths`` to the true lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from titanpod.models.common.args import DecoderArgs


@dataclass
class KVCache:
    """Per-layer key and value tensors [B, K, S_max, D] and each row's current length.

    Build with ``KVCache.allocate`` (or ``for_model``); ``Transformer.forward_with_cache``
    writes into it and advances ``lengths_B``.
    """

    keys: list[torch.Tensor]
    """One [B, K, S_max, D] tensor per layer: rotated keys, by absolute position."""
    values: list[torch.Tensor]
    """One [B, K, S_max, D] tensor per layer: values, by absolute position."""
    lengths_B: torch.Tensor
    """Valid cached positions per row (int64, [B]); the next token of row b goes at ``lengths_B[b]``."""

    @classmethod
    def allocate(
        cls,
        args: DecoderArgs,
        batch_size: int,
        max_seq_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """An empty cache (all lengths 0) for ``batch_size`` rows of up to ``max_seq_len`` positions."""
        if batch_size < 1 or max_seq_len < 1:
            raise ValueError(f"A KV cache needs batch_size >= 1 and max_seq_len >= 1, got {batch_size}, {max_seq_len}.")
        shape = (batch_size, args.n_kv_heads, max_seq_len, args.resolved_head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(args.n_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(args.n_layers)]
        lengths_B = torch.zeros(batch_size, dtype=torch.long, device=device)
        return cls(keys, values, lengths_B)

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch_size: int, max_seq_len: int | None = None) -> KVCache:
        """A cache shaped for ``model`` (a ``Transformer``), in the dtype and on the device of its embeddings.

        ``max_seq_len`` defaults to the model's ``args.max_seq_len``.
        """
        args: DecoderArgs = model.args  # type: ignore[assignment]
        table = model.tok_embeddings.weight  # type: ignore[union-attr]
        return cls.allocate(args, batch_size, max_seq_len or args.max_seq_len, table.dtype, table.device)

    @property
    def batch_size(self) -> int:
        """Rows in the cache."""
        return int(self.lengths_B.shape[0])

    @property
    def max_seq_len(self) -> int:
        """Positions each row can hold."""
        return int(self.keys[0].shape[2])

    @property
    def n_layers(self) -> int:
        """Layers the cache serves."""
        return len(self.keys)

    def set_lengths(self, lengths_B: torch.Tensor | list[int] | int) -> None:
        """Declare how many positions of each row are valid (e.g. true prompt lengths after a padded prefill).

        Positions at or past a row's length are ignored by later calls and overwritten as the row grows.
        """
        lengths = torch.as_tensor(lengths_B, dtype=torch.long, device=self.lengths_B.device).expand(self.batch_size)
        if bool((lengths < 0).any()) or bool((lengths > self.max_seq_len).any()):
            raise ValueError(f"Cache lengths must lie in [0, {self.max_seq_len}], got {lengths.tolist()}.")
        self.lengths_B = lengths.clone()

    def write(
        self, layer: int, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor, positions_BS: torch.Tensor, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys/values of ``layer`` at ``positions_BS``; return its cache up to ``end``, [B, K, T, D]."""
        B, K, S, D = k_BKSD.shape
        index_BKSD = positions_BS[:, None, :, None].expand(B, K, S, D)
        self.keys[layer].scatter_(2, index_BKSD, k_BKSD.to(self.keys[layer].dtype))
        self.values[layer].scatter_(2, index_BKSD, v_BKSD.to(self.values[layer].dtype))
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def cache_positions(start_B: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Absolute positions [B, S] of ``seq_len`` new tokens per row, row b starting at ``start_B[b]``."""
    return start_B[:, None] + torch.arange(seq_len, device=start_B.device)[None, :]


def cached_causal_mask(positions_BS: torch.Tensor, end: int) -> torch.Tensor:
    """Boolean mask [B, 1, S, T]: the query at position p sees cache positions 0 .. p of its row (T = ``end``).

    A query always sees its own position, so no row is fully masked.
    """
    keys_T = torch.arange(end, device=positions_BS.device)
    return (keys_T[None, None, :] <= positions_BS[:, :, None]).unsqueeze(1)


def cached_attention(
    q_BHSD: torch.Tensor, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor, positions_BS: torch.Tensor
) -> torch.Tensor:
    """Attention of new queries over cached keys/values, causal by absolute position; [B, H, S, D].

    The plain PyTorch reference (SDPA with a boolean mask, GQA): decoding is an inference
    path, so it does not go through the training attention slot.
    """
    mask_B1ST = cached_causal_mask(positions_BS, k_BKTD.shape[2])
    return F.scaled_dot_product_attention(q_BHSD, k_BKTD, v_BKTD, attn_mask=mask_B1ST, enable_gqa=True)
