"""The Pallas output projection + cross-entropy kernels and their ``custom_vjp``, importing only JAX.

Legend: N tokens, M model dim, V vocabulary; bn and bv the row and vocabulary tiles.

How the kernels work is in ``titanpod.kernels.pallas_loss``, the PyTorch op that runs them; this module
holds the kernels themselves, their tiles, VMEM budget and cost estimates, so that they build where
no PyTorch is installed (``tools/bench/pallas_on_tpu.py`` on a TPU machine).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

DEFAULT_IGNORE_INDEX = -100
"""Label of a row no loss is taken over, unless the caller names another (``titanpod.models.IGNORE_INDEX``)."""


@dataclass(frozen=True)
class PallasLossConfig:
    """Tiles of the Pallas cross-entropy kernels."""

    block_rows: int = 256
    """Token rows per tile (rows are padded to a multiple)."""
    block_vocab: int = 512
    """Vocabulary entries per tile (a last, partial tile is masked; the head is never padded)."""
    interpret: bool | None = None
    """Run Pallas in interpret mode; ``None`` does so unless the tensors are on a TPU (see ``pallas_interpret``)."""
    keep_logits: bool = False
    """Trade memory for flops: the forward also writes the [N, V] logits in the inputs' dtype (2 GiB at 8,192
    rows of a 128K vocabulary in bf16) and the backward reads them instead of recomputing them, 6 N V M flops
    in all where ``False`` does 10 N V M and holds no [N, V] array. On the xla lane the logits are kept from
    the forward to the backward; on the torch lanes the gradient op reruns the forward (``jax.vjp``), so the
    logits live only inside the gradient op and the loss does 8 N V M there instead of 12."""


def _head_tile(w: Any, v: Any, block_v: int, vocab: int) -> Any:
    """Vocabulary tile ``v`` of the head with its rows past ``vocab`` (read past the head's end) zeroed."""
    import jax
    import jax.numpy as jnp

    rows = v * block_v + jax.lax.broadcasted_iota(jnp.int32, (w.shape[0], 1), 0)
    return jnp.where(rows < vocab, w, jnp.zeros_like(w))


def _logits_tile(h: Any, w: Any, v: Any, block_v: int, vocab: int) -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp

    logits = jnp.dot(h, w.T, preferred_element_type=jnp.float32)
    cols = v * block_v + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    return jnp.where(cols < vocab, logits, -jnp.inf), cols


def _forward_kernel(h_ref, w_ref, labels_ref, loss_ref, lse_ref, max_ref, sum_ref, target_ref, *, block_v, vocab, n_v):
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    v = pl.program_id(1)

    @pl.when(v == 0)
    def _start():
        max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
        target_ref[...] = jnp.zeros(target_ref.shape, jnp.float32)

    logits, cols = _logits_tile(h_ref[...], _head_tile(w_ref[...], v, block_v, vocab), v, block_v, vocab)
    old_max = max_ref[...]
    new_max = jnp.maximum(old_max, logits.max(axis=1, keepdims=True))
    sum_ref[...] = sum_ref[...] * jnp.exp(old_max - new_max) + jnp.exp(logits - new_max).sum(axis=1, keepdims=True)
    max_ref[...] = new_max
    target_ref[...] += jnp.where(cols == labels_ref[...], logits, 0.0).sum(axis=1, keepdims=True)

    @pl.when(v == n_v - 1)
    def _finish():
        lse = max_ref[...] + jnp.log(sum_ref[...])
        lse_ref[...] = lse
        loss_ref[...] = lse - target_ref[...]


def _dlogits(h, w, labels, lse, scale, v, block_v, vocab):
    import jax.numpy as jnp

    logits, cols = _logits_tile(h, w, v, block_v, vocab)
    probs = jnp.exp(logits - lse)
    return (probs - (cols == labels).astype(jnp.float32)) * scale


def _kept_dlogits(logits, labels, lse, scale, v, block_v, vocab):
    """``_dlogits`` from a tile of kept logits; columns past ``vocab`` (read past the array's end) are zeroed."""
    import jax
    import jax.numpy as jnp

    cols = v * block_v + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    probs = jnp.exp(logits.astype(jnp.float32) - lse)
    return jnp.where(cols < vocab, (probs - (cols == labels).astype(jnp.float32)) * scale, 0.0)


def _forward_keep_kernel(h_ref, w_ref, labels_ref, loss_ref, lse_ref, max_ref, sum_ref, target_ref, logits_ref, *,
                         block_v, vocab, n_v):  # fmt: skip
    """``_forward_kernel`` that also writes the tile's logits, in ``logits_ref``'s dtype."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    v = pl.program_id(1)

    @pl.when(v == 0)
    def _start():
        max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
        target_ref[...] = jnp.zeros(target_ref.shape, jnp.float32)

    logits, cols = _logits_tile(h_ref[...], _head_tile(w_ref[...], v, block_v, vocab), v, block_v, vocab)
    logits_ref[...] = logits.astype(logits_ref.dtype)  # columns past the vocabulary are not written back
    old_max = max_ref[...]
    new_max = jnp.maximum(old_max, logits.max(axis=1, keepdims=True))
    sum_ref[...] = sum_ref[...] * jnp.exp(old_max - new_max) + jnp.exp(logits - new_max).sum(axis=1, keepdims=True)
    max_ref[...] = new_max
    target_ref[...] += jnp.where(cols == labels_ref[...], logits, 0.0).sum(axis=1, keepdims=True)

    @pl.when(v == n_v - 1)
    def _finish():
        lse = max_ref[...] + jnp.log(sum_ref[...])
        lse_ref[...] = lse
        loss_ref[...] = lse - target_ref[...]


def _kept_grad_h_kernel(logits_ref, w_ref, labels_ref, lse_ref, scale_ref, dh_ref, acc_ref, *, block_v, vocab, n_v):
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    v = pl.program_id(1)

    @pl.when(v == 0)
    def _start():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    w = _head_tile(w_ref[...], v, block_v, vocab)
    d = _kept_dlogits(logits_ref[...], labels_ref[...], lse_ref[...], scale_ref[...], v, block_v, vocab)
    acc_ref[...] += jnp.dot(d.astype(w.dtype), w, preferred_element_type=jnp.float32)

    @pl.when(v == n_v - 1)
    def _finish():
        dh_ref[...] = acc_ref[...].astype(dh_ref.dtype)


def _kept_grad_w_kernel(h_ref, logits_ref, labels_ref, lse_ref, scale_ref, dw_ref, acc_ref, *, block_v, vocab, n_n):
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    v, n = pl.program_id(0), pl.program_id(1)

    @pl.when(n == 0)
    def _start():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    d = _kept_dlogits(logits_ref[...], labels_ref[...], lse_ref[...], scale_ref[...], v, block_v, vocab)
    acc_ref[...] += jnp.dot(d.T.astype(h_ref.dtype), h_ref[...], preferred_element_type=jnp.float32)

    @pl.when(n == n_n - 1)
    def _finish():  # rows of a partial last tile past the vocabulary are not written back
        dw_ref[...] = acc_ref[...].astype(dw_ref.dtype)


def _grad_h_kernel(h_ref, w_ref, labels_ref, lse_ref, scale_ref, dh_ref, acc_ref, *, block_v, vocab, n_v):
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    v = pl.program_id(1)

    @pl.when(v == 0)
    def _start():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    w = _head_tile(w_ref[...], v, block_v, vocab)
    d = _dlogits(h_ref[...], w, labels_ref[...], lse_ref[...], scale_ref[...], v, block_v, vocab)
    acc_ref[...] += jnp.dot(d.astype(w.dtype), w, preferred_element_type=jnp.float32)

    @pl.when(v == n_v - 1)
    def _finish():
        dh_ref[...] = acc_ref[...].astype(dh_ref.dtype)


def _grad_w_kernel(h_ref, w_ref, labels_ref, lse_ref, scale_ref, dw_ref, acc_ref, *, block_v, vocab, n_n):
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    v, n = pl.program_id(0), pl.program_id(1)

    @pl.when(n == 0)
    def _start():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    w = _head_tile(w_ref[...], v, block_v, vocab)
    d = _dlogits(h_ref[...], w, labels_ref[...], lse_ref[...], scale_ref[...], v, block_v, vocab)
    acc_ref[...] += jnp.dot(d.T.astype(h_ref.dtype), h_ref[...], preferred_element_type=jnp.float32)

    @pl.when(n == n_n - 1)
    def _finish():  # rows of a partial last tile past the vocabulary are not written back
        dw_ref[...] = acc_ref[...].astype(dw_ref.dtype)


LOSS_MATMULS = {"forward": 1, "grad_h": 2, "grad_w": 2}
"""[N, M] x [M, V] matmuls each kernel does over the padded rows and the whole vocabulary tiles: the forward
the logits; each gradient kernel recomputes them and multiplies back (dH = dL W, dW = dL^T H). Forward and
backward together are 10 N V M flops, not the 6 N V M of a loss that keeps its logits."""

KEPT_LOGITS_MATMULS = {"forward": 1, "grad_h": 1, "grad_w": 1}
"""``LOSS_MATMULS`` with ``keep_logits``: the gradient kernels read the forward's logits and only multiply back,
6 N V M flops in all."""


def loss_cost_estimates(rows: int, vocab: int, dim: int, itemsize: int, config: PallasLossConfig) -> dict[str, Any]:
    """The ``pl.CostEstimate`` of each kernel (``"forward"``, ``"grad_h"``, ``"grad_w"``) for ``rows`` token
    rows (already padded to whole row tiles) and a ``vocab`` x ``dim`` head of ``itemsize`` bytes.

    Flops: ``LOSS_MATMULS`` (``KEPT_LOGITS_MATMULS`` with ``config.keep_logits``) matmuls of 2 x rows x dim over
    the vocabulary's whole tiles (a partial last tile is computed whole; the elementwise softmax work is left
    out). Transcendentals: an exponential per logit (and the forward's logarithm per row). Bytes: a block that
    stays put along the inner grid axis is read once, the other input once per outer tile; the gradients are
    written once in ``itemsize`` bytes; per-row columns in float32; kept logits (``rows`` x ``vocab`` in
    ``itemsize`` bytes) written once by the forward and read once by each gradient kernel.
    """
    from jax.experimental import pallas as pl

    n_rows, n_vocab = rows // config.block_rows, -(-vocab // config.block_vocab)
    logits, column = rows * n_vocab * config.block_vocab, rows * 4
    hidden, head = rows * dim * itemsize, vocab * dim * itemsize
    if config.keep_logits:
        kept = rows * vocab * itemsize
        matmuls = KEPT_LOGITS_MATMULS
        moved = {
            "forward": hidden + n_rows * head + column + 5 * column + kept,  # as below, and the logits out
            "grad_h": kept + n_rows * head + 3 * column + hidden,  # logits; W per row tile; columns; dh
            "grad_w": kept + n_vocab * (hidden + 3 * column) + head,  # logits; h and columns per vocab tile; dW
        }
    else:
        matmuls = LOSS_MATMULS
        moved = {
            "forward": hidden + n_rows * head + column + 5 * column,  # h; W per row tile; labels; five columns out
            "grad_h": hidden + n_rows * head + 3 * column + hidden,  # h; W per row tile; columns; dh
            "grad_w": head + n_vocab * (hidden + 3 * column) + head,  # W; h and columns per vocab tile; dW
        }
    return {
        kernel: pl.CostEstimate(
            flops=count * 2 * logits * dim,
            transcendentals=logits + (rows if kernel == "forward" else 0),
            bytes_accessed=moved[kernel],
        )
        for kernel, count in matmuls.items()
    }


VMEM_BUDGET = 48 * 2**20
"""Bytes of a TensorCore's VMEM the loss kernels may use (v5p and v7 have 64 MiB, v5e and v6e 128 MiB). Mosaic's
default scoped limit is lower (16 MiB on v5p), so the kernels ask for what their tiles need."""


def loss_vmem_bytes(block_rows: int, block_vocab: int, dim: int, itemsize: int, keep_logits: bool = False) -> int:
    """VMEM the largest loss kernel may need with these tiles: double-buffered hidden and head tiles of ``itemsize``
    bytes, the larger gradient tile (dh's or dW's) double-buffered in ``itemsize`` bytes with its float32
    accumulator, the logits tile's temporaries (with ``keep_logits``, also a double-buffered logits tile in
    ``itemsize`` bytes), and a quarter more plus 4 MiB for what Mosaic adds (its own count came to 1.06-1.13x the
    rest for widths of 4,096 to 16,384)."""
    inputs = 2 * dim * itemsize * (block_rows + block_vocab)
    gradient = dim * (2 * itemsize + 4) * max(block_rows, block_vocab)
    kept = 2 * block_rows * block_vocab * itemsize if keep_logits else 0
    return (inputs + gradient + kept + 4 * block_rows * block_vocab * 4) * 5 // 4 + 4 * 2**20


def fitted_tiles(config: PallasLossConfig, dim: int, itemsize: int) -> PallasLossConfig:
    """``config`` with its tiles halved (the larger first, down to 128) until the kernels fit ``VMEM_BUDGET`` for a
    model dim of ``dim``: a wide model (4,096 and up) needs smaller tiles than the defaults."""
    import dataclasses

    rows, vocab = config.block_rows, config.block_vocab
    while loss_vmem_bytes(rows, vocab, dim, itemsize, config.keep_logits) > VMEM_BUDGET and max(rows, vocab) > 128:
        if vocab >= rows:
            vocab //= 2
        else:
            rows //= 2
    return dataclasses.replace(config, block_rows=rows, block_vocab=vocab)


def make_pallas_cross_entropy(
    config: PallasLossConfig,
    vocab: int,
    dim: int,
    interpret: bool,
    itemsize: int = 4,
    ignore_index: int = DEFAULT_IGNORE_INDEX,
) -> Any:
    """A JAX function ``(h_NM, w_VM, labels_N) -> mean loss`` with a Pallas forward and backward
    (run in Pallas interpret mode when ``interpret``) for hidden states and head of ``itemsize`` bytes; the tiles
    are ``config``'s, made smaller where they would not fit a TensorCore's VMEM (``fitted_tiles``); rows labelled
    ``ignore_index`` take no part in the mean."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    config = fitted_tiles(config, dim, itemsize)
    vmem = loss_vmem_bytes(config.block_rows, config.block_vocab, dim, itemsize, config.keep_logits)
    limits = None if interpret else pltpu.CompilerParams(vmem_limit_bytes=min(max(vmem, 16 * 2**20), VMEM_BUDGET))

    bv, bn = config.block_vocab, config.block_rows
    n_v = -(-vocab // bv)

    def padded(h, labels):  # rows to whole row tiles (labels of the added rows ignored); the head stays as it is
        n_pad = -h.shape[0] % bn
        h = jnp.pad(h, ((0, n_pad), (0, 0)))
        labels = jnp.pad(labels.astype(jnp.int32), (0, n_pad), constant_values=ignore_index)[:, None]
        return h, labels, h.shape[0] // bn

    def costs(h):  # of the padded rows
        return loss_cost_estimates(h.shape[0], vocab, dim, h.dtype.itemsize, config)

    row = pl.BlockSpec((bn, 1), lambda i, v: (i, 0))
    hidden = pl.BlockSpec((bn, dim), lambda i, v: (i, 0))
    weight = pl.BlockSpec((bv, dim), lambda i, v: (v, 0))

    def forward_rows(h, w, labels):  # per-row losses, logsumexps and (with keep_logits) the padded rows' logits
        h, labels, n_n = padded(h, labels)
        column = jax.ShapeDtypeStruct((h.shape[0], 1), jnp.float32)
        kernel, out_specs, out_shape = _forward_kernel, [row] * 5, [column] * 5
        if config.keep_logits:
            kernel = _forward_keep_kernel
            out_specs = [*out_specs, pl.BlockSpec((bn, bv), lambda i, v: (i, v))]
            out_shape = [*out_shape, jax.ShapeDtypeStruct((h.shape[0], vocab), h.dtype)]
        loss, lse, *rest = pl.pallas_call(
            functools.partial(kernel, block_v=bv, vocab=vocab, n_v=n_v), grid=(n_n, n_v),
            in_specs=[hidden, weight, row], out_specs=out_specs, out_shape=out_shape, interpret=interpret,
            cost_estimate=costs(h)["forward"], compiler_params=limits,
        )(h, w, labels)  # fmt: skip
        return loss[:, 0], lse, (rest[-1] if config.keep_logits else None)

    def mean_loss(h, w, labels):
        valid = labels != ignore_index
        loss, _, _ = forward_rows(h, w, labels)
        return jnp.where(valid, loss[: h.shape[0]], 0.0).sum() / valid.sum()

    @jax.custom_vjp
    def cross_entropy(h, w, labels):
        return mean_loss(h, w, labels)

    def cross_entropy_forward(h, w, labels):
        valid = labels != ignore_index
        loss, lse, logits = forward_rows(h, w, labels)
        value = jnp.where(valid, loss[: h.shape[0]], 0.0).sum() / valid.sum()
        return value, (h, w, labels, lse, logits)

    def cross_entropy_backward(residuals, grad):
        h0, w, labels0, lse, logits = residuals
        valid = labels0 != ignore_index
        scale_rows = jnp.where(valid, grad / valid.sum(), 0.0).astype(jnp.float32)
        h, labels, n_n = padded(h0, labels0)
        scale = jnp.pad(scale_rows, (0, h.shape[0] - h0.shape[0]))[:, None]
        statics = {"block_v": bv, "vocab": vocab}
        by_vocab = {"hidden": pl.BlockSpec((bn, dim), lambda v, i: (i, 0)),
                    "weight": pl.BlockSpec((bv, dim), lambda v, i: (v, 0)),
                    "row": pl.BlockSpec((bn, 1), lambda v, i: (i, 0)),
                    "logits": pl.BlockSpec((bn, bv), lambda v, i: (i, v))}  # fmt: skip
        if config.keep_logits:  # the gradient kernels read the logits in place of the hidden states or head
            grad_h_kernel, grad_h_first, grad_h_spec = (
                _kept_grad_h_kernel,
                logits,
                pl.BlockSpec((bn, bv), lambda i, v: (i, v)),
            )
            grad_w_kernel, grad_w_second, grad_w_spec = _kept_grad_w_kernel, logits, by_vocab["logits"]
        else:
            grad_h_kernel, grad_h_first, grad_h_spec = _grad_h_kernel, h, hidden
            grad_w_kernel, grad_w_second, grad_w_spec = _grad_w_kernel, w, by_vocab["weight"]
        dh = pl.pallas_call(
            functools.partial(grad_h_kernel, n_v=n_v, **statics), grid=(n_n, n_v),
            in_specs=[grad_h_spec, weight, row, row, row], out_specs=hidden,
            out_shape=jax.ShapeDtypeStruct(h.shape, h.dtype), scratch_shapes=[pltpu.VMEM((bn, dim), jnp.float32)],
            interpret=interpret, cost_estimate=costs(h)["grad_h"], compiler_params=limits,
        )(grad_h_first, w, labels, lse, scale)  # fmt: skip
        dw = pl.pallas_call(
            functools.partial(grad_w_kernel, n_n=n_n, **statics), grid=(n_v, n_n),
            in_specs=[by_vocab["hidden"], grad_w_spec, by_vocab["row"], by_vocab["row"], by_vocab["row"]],
            out_specs=by_vocab["weight"], out_shape=jax.ShapeDtypeStruct(w.shape, w.dtype),
            scratch_shapes=[pltpu.VMEM((bv, dim), jnp.float32)], interpret=interpret,
            cost_estimate=costs(h)["grad_w"], compiler_params=limits,
        )(h, grad_w_second, labels, lse, scale)  # fmt: skip
        return dh[: h0.shape[0]], dw, None

    cross_entropy.defvjp(cross_entropy_forward, cross_entropy_backward)
    return cross_entropy
