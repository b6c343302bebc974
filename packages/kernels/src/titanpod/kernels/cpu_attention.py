"""Causal flash attention in C++ for the CPU lane, behind the model's attention slot.

Legend: B batch, H query heads, K key/value heads, S sequence, D head dim.

``kernels.attention cpu_flash``. The kernel (``cpu_attention.cpp``, built on first use by
``native_build``) keeps one head's rows in vector registers and never holds an [S, S]
matrix: the forward saves each row's log-sum-exp, the backward recomputes the scores. It is
fastest where ATen's CPU flash attention is furthest from the machine's peak, at small head
dims (16, 32). Two custom ops (``titanpod::cpu_attention`` and its backward) carry it, so
``make_fx``, the whole step and inductor see one node each way. The ops compute in fp32;
bf16 and fp16 inputs are widened on the way in and narrowed on the way out.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from titanpod.kernels.native_build import shared_library

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
"""The kernel's C++ source."""
HEAD_DIMS = (16, 32, 64, 128)
"""Head dims the kernel is built for (fastest against ATen's kernel at 16 and 32)."""
FORWARD_OP = "titanpod::cpu_attention"
"""The forward op's qualified name: ``(q, k, v, starts, window, scale) -> (out, lse)``."""
BACKWARD_OP = "titanpod::cpu_attention_backward"
"""The backward op's qualified name: ``(q, k, v, out, lse, grad_out, starts, window, scale) -> (dq, dk, dv)``."""

_P = ctypes.c_void_p
_I64 = ctypes.POINTER(ctypes.c_int64)


@functools.cache
def _library() -> ctypes.CDLL:
    library = shared_library(SOURCE)
    common = [_I64, _I64, ctypes.c_float, ctypes.c_int64, _P]
    library.titanpod_attention_forward.argtypes = [*common, _P, _P, _P, _P, _P, ctypes.c_int]
    library.titanpod_attention_backward.argtypes = [*common, *[_P] * 9, ctypes.c_int]
    return library


def _int64s(values: list[int]) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * len(values))(*values)


def _row_major(t: Tensor) -> Tensor:
    """``t`` with a contiguous last dim (what the kernel reads), copied only if it has not."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _pointer(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _problem(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor | None) -> tuple[ctypes.Array, ctypes.Array]:
    B, H, S, D = q.shape
    last = grad_out if grad_out is not None else q  # the forward has no grad_out; its strides go unread
    strides = [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *last.stride()[:3]]
    return _int64s([B, H, k.shape[1], S, D]), _int64s(strides)


def _forward_impl(
    q: Tensor, k: Tensor, v: Tensor, starts: Tensor | None, window: int, scale: float
) -> tuple[Tensor, Tensor]:
    q, k, v = _row_major(q), _row_major(k), _row_major(v)
    B, H, S, D = q.shape
    out, lse = q.new_empty(B, H, S, D), q.new_empty(B, H, S)
    dims, strides = _problem(q, k, v, None)
    pointers = [t.data_ptr() for t in (q, k, v, out, lse)]
    _library().titanpod_attention_forward(dims, strides, scale, window, _pointer(starts), *pointers,
                                          torch.get_num_threads())  # fmt: skip
    return out, lse


def _backward_impl(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, starts: Tensor | None, window: int,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    q, k, v, grad_out = _row_major(q), _row_major(k), _row_major(v), _row_major(grad_out)
    out, lse = out.contiguous(), lse.contiguous()
    grad_q, grad_k, grad_v = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    dims, strides = _problem(q, k, v, grad_out)
    pointers = [t.data_ptr() for t in (q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v)]
    _library().titanpod_attention_backward(dims, strides, scale, window, _pointer(starts), *pointers,
                                           torch.get_num_threads())  # fmt: skip
    return grad_q, grad_k, grad_v


@functools.cache
def cpu_attention_op() -> Callable[..., tuple[Tensor, Tensor]]:
    """The forward custom op (registered with torch on first use, with its backward and autograd):
    ``(q_BHSD, k_BKSD, v_BKSD, starts_BS or None, window (-1: none), scale) -> (out_BHSD, lse_BHS)``,
    all fp32 on the CPU; ``starts_BS`` is each query's document's first position."""

    @torch.library.custom_op(FORWARD_OP, mutates_args=())
    def forward(
        q: Tensor, k: Tensor, v: Tensor, starts: Tensor | None, window: int, scale: float
    ) -> tuple[Tensor, Tensor]:
        return _forward_impl(q, k, v, starts, window, scale)

    @forward.register_fake
    def _(q, k, v, starts, window, scale):
        B, H, S, D = q.shape
        return q.new_empty(B, H, S, D), q.new_empty(B, H, S)

    @torch.library.custom_op(BACKWARD_OP, mutates_args=())
    def backward(
        q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, starts: Tensor | None,
        window: int, scale: float,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        return _backward_impl(q, k, v, out, lse, grad_out, starts, window, scale)

    @backward.register_fake
    def _(q, k, v, out, lse, grad_out, starts, window, scale):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        q, k, v, starts, ctx.window, ctx.scale = inputs
        ctx.save_for_backward(q, k, v, *output, starts)

    def grad(ctx, grad_out, grad_lse):
        q, k, v, out, lse, starts = ctx.saved_tensors
        grad_q, grad_k, grad_v = backward(q, k, v, out, lse, grad_out, starts, ctx.window, ctx.scale)
        return grad_q, grad_k, grad_v, None, None, None

    forward.register_autograd(grad, setup_context=setup_context)
    return forward


def document_starts(document_ids_BS: Tensor) -> Tensor:
    """Each position's document's first position, [B, S] int64 (ids are equal within a document)."""
    S = document_ids_BS.shape[1]
    i_S = torch.arange(S, device=document_ids_BS.device)
    first_BS = torch.ones_like(document_ids_BS, dtype=torch.bool)
    first_BS[:, 1:] = document_ids_BS[:, 1:] != document_ids_BS[:, :-1]
    return torch.cummax(torch.where(first_BS, i_S, 0), dim=1).values.contiguous()


@dataclass(frozen=True)
class CpuFlashAttention:
    """Callable with the ``AttentionOp`` signature: causal (optionally local) GQA attention on the CPU by the
    C++ kernel, kept within packed documents when given document ids."""

    window: int | None = None
    """Local attention: each query sees itself and the ``window`` keys before it; ``None`` is plain causal."""

    def __post_init__(self) -> None:
        cpu_attention_op()  # registered before any capture, so a cached compiled step finds it

    def __call__(self, q_BHSD: Tensor, k_BKSD: Tensor, v_BKSD: Tensor, document_ids_BS: Tensor | None = None) -> Tensor:
        """The attended values [B, H, S, D], in ``q_BHSD``'s dtype."""
        self._check(q_BHSD, k_BKSD)
        starts_BS = None if document_ids_BS is None else document_starts(document_ids_BS)
        window = -1 if self.window is None else self.window
        fp32 = [t.float() for t in (q_BHSD, k_BKSD, v_BKSD)]
        out_BHSD, _ = torch.ops.titanpod.cpu_attention(*fp32, starts_BS, window, q_BHSD.shape[-1] ** -0.5)
        return out_BHSD.to(q_BHSD.dtype)

    @staticmethod
    def _check(q_BHSD: Tensor, k_BKSD: Tensor) -> None:
        if q_BHSD.device.type != "cpu":
            raise ValueError(
                f"kernels.attention 'cpu_flash' runs on the cpu lane only (got tensors on {q_BHSD.device}); "
                "use kernels.attention 'sdpa' or 'splash' there."
            )
        D = q_BHSD.shape[-1]
        if D not in HEAD_DIMS:
            raise ValueError(
                f"kernels.attention 'cpu_flash' is built for head dims {', '.join(map(str, HEAD_DIMS))}, and this "
                f"model's is {D}; use kernels.attention 'sdpa'."
            )
        if q_BHSD.shape[1] % k_BKSD.shape[1] or k_BKSD.shape[2] != q_BHSD.shape[2]:
            raise ValueError(
                f"kernels.attention 'cpu_flash' needs as many keys as queries and query heads a multiple of key "
                f"heads; got q {tuple(q_BHSD.shape)} and k {tuple(k_BKSD.shape)}."
            )
