"""What a step under bf16 autocast keeps beyond an all-bf16 block's saved tensors, checked against libtpu's compiles.

Legend: B batch, S sequence, M model dim, V vocabulary, L blocks.

``activations.py`` measures a block whose parameters, input and every activation are in the compute dtype. Under
bf16 autocast (``train.precision`` bf16) the parameters are fp32, so some tensors are wider than that:

- The hidden states between blocks are in the embedding table's dtype: the parameter gather's dtype
  (``parallel.param_dtype``) when the step gathers parameters over a data axis, the stored fp32 otherwise (one
  device, or no data axis split), since autocast leaves the embedding and the residual adds as they are. A
  recomputed block keeps its input at that width (L x B x S x M x 4 bytes unsharded), and the final norm hands
  the head + loss its hidden states at that width too: the Pallas loss's kept logits, [B x S, V], are as wide.
- On the xla lane (torchax), each matmul multiplies bf16 operands into an fp32 result that is cast afterwards, so
  what ``selective`` keeps (the matmul outputs) is fp32; and where the hidden states are fp32, everything ``save``
  keeps is fp32 (norms, activations and residuals run in fp32; only the matmul operands are cast). A block
  recomputed in the backward is fused by XLA to about its all-bf16 saved set, so ``recompute``'s working memory
  stays the measured one.
- On the xla lane, XLA casts each block weight to bf16 once and keeps the copies for the backward (with the blocks
  as one loop, the whole stack is cast before the loop): 2 bytes a parameter of the local blocks when no FSDP
  gather makes the bf16 copies a block at a time.

Qwen 3 0.6B on v5litepod-1 (4 x 4,096 tokens, recompute): 1.75 GiB of fp32 block inputs and 0.82 GiB of bf16
weights, both in libtpu's buffer assignment (``f32[28,4,4096,1024]``, ``bf16[28,...]``); docs/recipes.md's table
sets each figure beside the compiler's.
"""

from __future__ import annotations

import dataclasses

import torch

from titanpod.models import DecoderArgs
from titanpod.recipes.planner.activations import SavedBytes, block_saved_bytes

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def hidden_itemsize(precision: torch.dtype, param_dtype: str, gathers: bool) -> int:
    """Bytes an element of the hidden states between blocks: the compute dtype's in fp32 steps; under bf16
    autocast the embedding's, which is ``param_dtype`` when the step gathers parameters and fp32 when not."""
    if precision == torch.float32:
        return 4
    return _BYTES[param_dtype] if gathers else 4


def widened_block(
    measured: SavedBytes,
    args: DecoderArgs,
    batch: int,
    seq_len: int,
    dtype: torch.dtype,
    hidden_bytes: int,
    *,
    jitted: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> SavedBytes:
    """``measured`` (a block measured in ``dtype``) as the step keeps it: its input ``hidden_bytes`` wide; when the
    step is ``jitted`` (one XLA program, the xla lane's) under bf16, the matmul outputs in fp32, and with an fp32
    hidden state everything saved in fp32."""
    region_input = measured.region_input * hidden_bytes // dtype.itemsize
    if not jitted or dtype == torch.float32:
        return dataclasses.replace(measured, region_input=region_input)
    wide = block_saved_bytes(args, batch, seq_len, torch.float32, tp, sequence_parallel)
    all_saved = wide.all_saved if hidden_bytes == 4 else measured.all_saved
    return SavedBytes(all_saved, wide.matmul_saved, region_input, recomputed=measured.all_saved)


def kept_logits_bytes(tokens: int, vocab: int, hidden_bytes: int) -> int:
    """The [tokens, vocab] logits the Pallas loss keeps with ``keep_logits``, as wide as the hidden states it
    takes: on the xla lane from the loss's forward to its backward, on the torch lanes inside the gradient op
    (which reruns the forward); either way at the head's backward, where no gradient as large is made."""
    return tokens * vocab * hidden_bytes


def weight_copy_bytes(block_numel: int, n_layers: int) -> int:
    """The bf16 copies of ``n_layers`` blocks of ``block_numel`` local parameters that XLA keeps for the backward."""
    return 2 * block_numel * n_layers
