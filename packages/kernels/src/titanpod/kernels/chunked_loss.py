"""Output projection + cross-entropy in row chunks, never holding the full [tokens, vocab] logits.

Legend: N tokens, M model dim, V vocabulary, C rows in a chunk.

Each chunk's logits are made, turned into its loss and, when gradients are wanted, into
its share of the input and weight gradients at once, then dropped; the backward only
scales the stored gradients. Peak memory is one chunk of logits instead of all of them.
"""

from __future__ import annotations

from typing import Any

import torch

from titanpod.models import IGNORE_INDEX

DEFAULT_CHUNK_BYTES = 256 * 1024**2
"""Budget for one chunk of fp32 logits when no chunk size is given."""


def _chunk_rows(vocab: int, chunk_rows: int | None) -> int:
    return chunk_rows if chunk_rows is not None else max(1, DEFAULT_CHUNK_BYTES // (4 * vocab))


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, h_NM: torch.Tensor, w_VM: torch.Tensor, labels_N: torch.Tensor, chunk_rows: int
    ) -> torch.Tensor:
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        valid_N = labels_N != IGNORE_INDEX
        count = valid_N.sum()
        total = torch.zeros((), dtype=torch.float32, device=h_NM.device)
        grad_h = torch.empty_like(h_NM) if want_h else None
        grad_w = torch.zeros(w_VM.shape, dtype=torch.float32, device=w_VM.device) if want_w else None
        scale = 1.0 / count.clamp(min=1).float()
        for start in range(0, h_NM.shape[0], chunk_rows):
            h_CM = h_NM[start : start + chunk_rows]
            labels_C = labels_N[start : start + chunk_rows]
            valid_C = valid_N[start : start + chunk_rows]
            logits_CV = (h_CM @ w_VM.T).float()
            lse_C = torch.logsumexp(logits_CV, dim=-1)
            safe_labels_C = torch.where(valid_C, labels_C, 0)
            target_C = logits_CV.gather(1, safe_labels_C[:, None]).squeeze(1)
            total = total + torch.where(valid_C, lse_C - target_C, 0.0).sum()
            if grad_h is None and grad_w is None:
                continue
            # d(mean loss)/d(logits) = (softmax - one_hot(label)) / count on labelled rows
            dlogits_CV = torch.exp(logits_CV.sub_(lse_C[:, None]))
            dlogits_CV[torch.arange(len(labels_C), device=h_NM.device), safe_labels_C] -= 1.0
            dlogits_CV.mul_((valid_C.float() * scale)[:, None])
            if grad_h is not None:
                grad_h[start : start + chunk_rows] = (dlogits_CV.to(w_VM.dtype) @ w_VM).to(h_NM.dtype)
            if grad_w is not None:
                grad_w.addmm_(dlogits_CV.T, h_CM.float())
        ctx.save_for_backward(*(g for g in (grad_h, grad_w) if g is not None))
        ctx.stored = (grad_h is not None, grad_w is not None)
        ctx.w_dtype = w_VM.dtype
        return total / count.float()  # nan when nothing is labelled, as F.cross_entropy gives

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        saved = iter(ctx.saved_tensors)
        grad_h = next(saved) * grad_loss.to(ctx.saved_tensors[0].dtype) if ctx.stored[0] else None
        grad_w = (next(saved) * grad_loss).to(ctx.w_dtype) if ctx.stored[1] else None
        return grad_h, grad_w, None, None


def chunked_linear_cross_entropy(
    h_BSM: torch.Tensor, weight_VM: torch.Tensor, labels_BS: torch.Tensor, chunk_rows: int | None = None
) -> torch.Tensor:
    """Mean cross-entropy of ``h @ weight.T`` against ``labels`` (``IGNORE_INDEX`` skipped), chunked.

    Same value and gradients as ``titanpod.models.linear_cross_entropy`` (logits in fp32);
    ``chunk_rows`` rows of logits exist at a time (default: 256 MiB of fp32 logits).
    """
    if h_BSM.shape[-1] != weight_VM.shape[-1]:
        raise ValueError(f"hidden width {h_BSM.shape[-1]} does not match the head's {weight_VM.shape[-1]}.")
    if labels_BS.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"labels must be integer token ids, got {labels_BS.dtype}.")
    h_NM = h_BSM.reshape(-1, h_BSM.shape[-1])
    labels_N = labels_BS.reshape(-1)
    return _ChunkedLinearCrossEntropy.apply(h_NM, weight_VM, labels_N, _chunk_rows(weight_VM.shape[0], chunk_rows))
