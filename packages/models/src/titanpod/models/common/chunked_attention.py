"""Positioned causal attention without a mask: each query chunk against its keys, merged by log-sum-exp.

Legend: B batch, H query heads, K key/value heads, D head dim, s queries held, S keys held, L chunk.

When queries and keys are whole chunks of one row (``SequenceChunks`` of one chunk length), a query
chunk c sees the key chunks before c entirely and chunk c causally, and no others. So its attention
is two flash-attention calls, neither needing a mask: over the earlier chunks (unmasked) and over its
own (causal), merged through their log-sum-exps. Memory stays linear in the row (no [s, S] mask).
The gradient uses the same identity as ring attention: each part's flash backward, given the merged
output and log-sum-exp, returns exactly that part's share of the merged attention's gradient.

Runs on the CPU through ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward).
"""

from __future__ import annotations

from typing import Any

import torch

from titanpod.models.common.sequence import SequenceChunks


def _parts(q_at: SequenceChunks, k_at: SequenceChunks) -> list[tuple[int, list[int], int]]:
    """Per query chunk (its index in ``q_at``): the key-chunk indices (in ``k_at``) it sees whole, and the
    index of its own chunk among the keys."""
    place = {chunk: index for index, chunk in enumerate(k_at.chunks)}
    return [
        (qi, [place[c] for c in sorted(k_at.chunks) if c < chunk], place[chunk]) for qi, chunk in enumerate(q_at.chunks)
    ]


def _rows(indices: list[int], L: int, device: torch.device) -> torch.Tensor:
    """Token rows of the key chunks at ``indices`` (positions in the held key tensor), in that order."""
    return torch.cat([torch.arange(i * L, (i + 1) * L, device=device) for i in indices])


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> Any:
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _flash_backward(grad, q, k, v, out, lse, causal: bool, scale: float) -> Any:
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, causal, scale=scale
    )


class _ChunkedCausal(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q_BHsD: torch.Tensor, k_BHSD: torch.Tensor, v_BHSD: torch.Tensor, plan: Any) -> torch.Tensor:
        L, parts, scale = plan
        outs, lses = [], []
        for qi, past, own in parts:
            q = q_BHsD[:, :, qi * L : (qi + 1) * L]
            k_own, v_own = k_BHSD[:, :, own * L : (own + 1) * L], v_BHSD[:, :, own * L : (own + 1) * L]
            out, lse = _flash(q, k_own, v_own, True, scale)
            if past:
                rows = _rows(past, L, q.device)
                out_past, lse_past = _flash(q, k_BHSD[:, :, rows], v_BHSD[:, :, rows], False, scale)
                merged = torch.logaddexp(lse, lse_past)
                out = out * (lse - merged).exp()[..., None] + out_past * (lse_past - merged).exp()[..., None]
                lse = merged
            outs.append(out.to(q.dtype))
            lses.append(lse)
        out_BHsD, lse_BHs = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        ctx.save_for_backward(q_BHsD, k_BHSD, v_BHSD, out_BHsD, lse_BHs)
        ctx.plan = plan
        return out_BHsD

    @staticmethod
    def backward(ctx: Any, grad_BHsD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        q_BHsD, k_BHSD, v_BHSD, out_BHsD, lse_BHs = ctx.saved_tensors
        L, parts, scale = ctx.plan
        grad_BHsD = grad_BHsD.contiguous()
        dq, dk, dv = torch.zeros_like(q_BHsD), torch.zeros_like(k_BHSD), torch.zeros_like(v_BHSD)
        for qi, past, own in parts:
            span = slice(qi * L, (qi + 1) * L)
            q, grad, out, lse = q_BHsD[:, :, span], grad_BHsD[:, :, span], out_BHsD[:, :, span], lse_BHs[:, :, span]
            own_span = slice(own * L, (own + 1) * L)
            g_q, g_k, g_v = _flash_backward(
                grad, q, k_BHSD[:, :, own_span], v_BHSD[:, :, own_span], out, lse, True, scale
            )
            dq[:, :, span] += g_q
            dk[:, :, own_span] += g_k
            dv[:, :, own_span] += g_v
            if past:
                rows = _rows(past, L, q.device)
                g_q, g_k, g_v = _flash_backward(grad, q, k_BHSD[:, :, rows], v_BHSD[:, :, rows], out, lse, False, scale)
                dq[:, :, span] += g_q
                dk.index_add_(2, rows, g_k)
                dv.index_add_(2, rows, g_v)
        return dq, dk, dv, None


def can_attend_in_chunks(q: torch.Tensor, q_at: SequenceChunks, k_at: SequenceChunks) -> bool:
    """Whether ``chunked_causal_attention`` serves these inputs: on the CPU, chunks of one length, and every
    query chunk's own chunk among the keys."""
    return (
        q.device.type == "cpu"
        and q_at.chunk_len == k_at.chunk_len
        and set(q_at.chunks) <= set(k_at.chunks)
        and q.dtype in (torch.float32, torch.bfloat16)
    )


def chunked_causal_attention(
    q_BHsD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor, q_at: SequenceChunks, k_at: SequenceChunks
) -> torch.Tensor:
    """Causal attention by position of queries at ``q_at`` over keys at ``k_at`` (see the module), [B, H, s, D].

    Key/value heads are repeated to the query heads (GQA) before the flash calls.
    """
    groups = q_BHsD.shape[1] // k_BKSD.shape[1]
    k_BHSD = k_BKSD.repeat_interleave(groups, dim=1) if groups > 1 else k_BKSD
    v_BHSD = v_BKSD.repeat_interleave(groups, dim=1) if groups > 1 else v_BKSD
    plan = (q_at.chunk_len, _parts(q_at, k_at), q_BHsD.shape[-1] ** -0.5)
    return _ChunkedCausal.apply(q_BHsD.contiguous(), k_BHSD.contiguous(), v_BHSD.contiguous(), plan)
