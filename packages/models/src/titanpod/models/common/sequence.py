"""Which part of each sequence a process computes, and causal attention by absolute position.

Legend: B batch, H query heads, K key/value heads, D head dim, S a whole row's length,
s the length a process keeps of it (S on one process).

A model computes every token of a row unless told otherwise. Context parallelism (in
``titanpod.parallel``) installs a ``SequenceShard`` that keeps some chunks of each row: the
model then embeds, rotates and scores only those tokens, at their positions in the whole row.
Attention over keys that sit elsewhere is causal by position (``positioned_sdpa_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SequenceChunks:
    """Where a held sequence sits in its row: equal chunks of ``chunk_len`` tokens, chunk c covering row
    positions ``c * chunk_len .. (c + 1) * chunk_len - 1``, held in the order of ``chunks``.

    Static (plain ints), so a kernel can build its mask from it while a step is traced.
    """

    chunk_len: int
    """Tokens per chunk."""
    chunks: tuple[int, ...]
    """The chunks held, in order."""

    @property
    def length(self) -> int:
        """Tokens held."""
        return self.chunk_len * len(self.chunks)

    def position_list(self) -> list[int]:
        """The row positions of the held tokens, in order."""
        return [c * self.chunk_len + i for c in self.chunks for i in range(self.chunk_len)]

    def positions(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The row positions of the held tokens, [s] int64."""
        starts_C = torch.tensor(self.chunks, dtype=torch.long, device=device) * self.chunk_len
        return (starts_C[:, None] + torch.arange(self.chunk_len, device=device)).flatten()


class SequenceShard(Protocol):
    """The tokens of each row this process computes, and their positions in the row."""

    def local(self, x_BS: torch.Tensor) -> torch.Tensor:
        """This process's tokens of every row of ``x_BS`` (tokens, labels or document ids), [B, s]."""
        ...

    def positions(self, S: int, device: torch.device) -> torch.Tensor:
        """The row positions of the tokens ``local`` keeps of a row of ``S`` tokens, [s] int64."""
        ...


class WholeSequence:
    """Every token of every row: the sequence is not split."""

    def local(self, x_BS: torch.Tensor) -> torch.Tensor:
        """``x_BS`` itself."""
        return x_BS

    def positions(self, S: int, device: torch.device) -> torch.Tensor:
        """``0 .. S - 1``."""
        return torch.arange(S, device=device)


class PositionedAttentionOp(Protocol):
    """Attention of queries at some positions of a row over keys at others, causal by position.

    Query i sees key j when ``k_at``'s position of j is at or before ``q_at``'s position of i and,
    given document ids, both lie in one document.
    """

    def __call__(
        self,
        q_BHsD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        q_at: SequenceChunks,
        k_at: SequenceChunks,
        q_document_ids_Bs: torch.Tensor | None = None,
        k_document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attended values, [B, H, s, D]."""
        ...


def positioned_causal_mask(
    q_at: SequenceChunks,
    k_at: SequenceChunks,
    device: torch.device,
    q_document_ids_Bs: torch.Tensor | None = None,
    k_document_ids_BS: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask, [s, S] (or [B, 1, s, S] with document ids): key at or before query, same document."""
    mask_sS = k_at.positions(device)[None, :] <= q_at.positions(device)[:, None]
    if q_document_ids_Bs is None or k_document_ids_BS is None:
        return mask_sS
    same_document_BsS = q_document_ids_Bs[:, :, None] == k_document_ids_BS[:, None, :]
    return (mask_sS & same_document_BsS).unsqueeze(1)


def positioned_sdpa_attention(
    q_BHsD: torch.Tensor,
    k_BKSD: torch.Tensor,
    v_BKSD: torch.Tensor,
    q_at: SequenceChunks,
    k_at: SequenceChunks,
    q_document_ids_Bs: torch.Tensor | None = None,
    k_document_ids_BS: torch.Tensor | None = None,
) -> torch.Tensor:
    """Positioned attention through SDPA (GQA): with document ids, SDPA with the explicit mask of
    ``positioned_causal_mask``; without, on the CPU, flash attention per query chunk with no mask at all
    (``titanpod.models.common.chunked_attention``: memory linear in the row, the same values to rounding)."""
    from titanpod.models.common.chunked_attention import can_attend_in_chunks, chunked_causal_attention  # a cycle

    if q_document_ids_Bs is None and can_attend_in_chunks(q_BHsD, q_at, k_at):
        return chunked_causal_attention(q_BHsD, k_BKSD, v_BKSD, q_at, k_at)
    mask = positioned_causal_mask(q_at, k_at, q_BHsD.device, q_document_ids_Bs, k_document_ids_BS)
    return F.scaled_dot_product_attention(q_BHsD, k_BKSD, v_BKSD, attn_mask=mask, enable_gqa=True)
