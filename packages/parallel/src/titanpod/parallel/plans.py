"""Sharding plans for the model classes titanpod ships (the decoder ``Transformer`` and FLUX.1); which family uses
which is stated in the family's spec (``titanpod.recipes.families``)."""

from __future__ import annotations

from titanpod.parallel.plan import ParamRule, ShardingPlan

_LAYER = r"layers\.\d+\."

DECODER_PLAN = ShardingPlan(
    params=(
        # vocabularies (151,936 for Qwen 3) divide over fewer ranks than the model width does
        ParamRule(r"tok_embeddings\.weight", shard_dim=1),
        ParamRule(r"output\.weight", shard_dim=1),
        ParamRule(r"norm\.weight", shard_dim=0, tp_grad="sum_if_sequence_parallel"),
        ParamRule(_LAYER + r"(attention_norm|ffn_norm)\.weight", shard_dim=0, tp_grad="sum_if_sequence_parallel"),
        # column-parallel: heads (or hidden units) split over tp, so shard the input width
        ParamRule(_LAYER + r"attention\.(wq|wk|wv)\.weight", shard_dim=1, tp_dim=0),
        ParamRule(_LAYER + r"feed_forward\.(w1|w3)\.weight", shard_dim=1, tp_dim=0),
        # row-parallel: the input width is split over tp, so shard the output width
        ParamRule(_LAYER + r"attention\.wo\.weight", shard_dim=0, tp_dim=1),
        ParamRule(_LAYER + r"feed_forward\.w2\.weight", shard_dim=0, tp_dim=1),
        # per-head norms see only this rank's heads: their gradients add up over tp. They hold
        # one head's width (128) of elements, too few to split over a large mesh: kept whole.
        ParamRule(_LAYER + r"attention\.(q_norm|k_norm)\.weight", shard_dim=None, tp_grad="sum"),
        ParamRule(_LAYER + r"feed_forward\.router\.weight", shard_dim=1),
        ParamRule(_LAYER + r"feed_forward\.experts\.(w1|w2|w3)", shard_dim=1, ep_dim=0),
    ),
    tp_regions=(_LAYER + r"attention", _LAYER + r"feed_forward"),
    sequence_starts=(r"tok_embeddings",),
    sequence_ends=(r"norm",),
)
"""Every decoder family's plan: FSDP everywhere, TP over heads and feed-forward width, EP over experts."""

_DOUBLE = r"double_blocks\.\d+\."
_SINGLE = r"single_blocks\.\d+\."
_STREAMS = r"(img|txt)"

FLUX_PLAN = ShardingPlan(
    params=(
        # per-head query/key norm scales: one head's width (128), kept whole; each tp rank sees its own heads
        ParamRule(r".*\.(q_norm|k_norm)\.weight", shard_dim=None, tp_grad="sum"),
        # column-parallel: heads (or hidden units) split over tp; biases split with their rows, whole over fsdp
        ParamRule(_DOUBLE + _STREAMS + r"_attn\.(wq|wk|wv)\.weight", shard_dim=1, tp_dim=0),
        ParamRule(_DOUBLE + _STREAMS + r"_attn\.(wq|wk|wv)\.bias", shard_dim=None, tp_dim=0),
        ParamRule(_DOUBLE + _STREAMS + r"_mlp\.w1\.weight", shard_dim=1, tp_dim=0),
        ParamRule(_DOUBLE + _STREAMS + r"_mlp\.w1\.bias", shard_dim=None, tp_dim=0),
        # the single block's fused rows: q, k, v (dim each) and the MLP input (4 x dim), 7 blocks of dim
        ParamRule(_SINGLE + r"linear1\.weight", shard_dim=1, tp_dim=0, tp_blocks=7),
        ParamRule(_SINGLE + r"linear1\.bias", shard_dim=None, tp_dim=0, tp_blocks=7),
        # row-parallel: the input width split over tp; the bias whole over tp, added after the sum
        ParamRule(_DOUBLE + _STREAMS + r"_attn\.wo\.weight", shard_dim=0, tp_dim=1),
        ParamRule(_DOUBLE + _STREAMS + r"_mlp\.w2\.weight", shard_dim=0, tp_dim=1),
        # the single block's fused columns: attention output (dim) and MLP activations (4 x dim), 5 blocks of dim
        ParamRule(_SINGLE + r"linear2\.weight", shard_dim=0, tp_dim=1, tp_blocks=5),
        ParamRule(r".*", shard_dim=0),
    ),
    tp_enters=(_DOUBLE + _STREAMS + r"_attn", _DOUBLE + _STREAMS + r"_mlp", _SINGLE + r"linear1"),
    tp_leaves=(_DOUBLE + _STREAMS + r"_attn\.wo", _DOUBLE + _STREAMS + r"_mlp\.w2", _SINGLE + r"linear2"),
)
"""FLUX.1's plan: FSDP over every parameter, tensor parallelism over the heads and MLP width of the double- and
single-stream blocks (the embedders, modulations and final layer stay whole over tp). Attention is joint over
both streams of a double block, so its region is entered at each stream's q/k/v module and left at each
``wo``. The single block's fused ``linear1`` and ``linear2`` split blockwise (``ParamRule.tp_blocks``): a
rank computes with whole heads of q, k and v and one share of the MLP's hidden units, and reads the same heads
and units in ``linear2``'s columns. The blocks assume the MLP is 4 x ``dim`` wide, as in every FLUX flavor (the
plan's check refuses widths the blocks do not divide). Sequence parallelism does not apply."""
