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

FLUX_PLAN = ShardingPlan(
    params=(
        # per-head query/key norm scales: one head's width (128), kept whole on every rank
        ParamRule(r".*\.(q_norm|k_norm)\.weight", shard_dim=None),
        ParamRule(r".*", shard_dim=0),
    ),
)
"""FLUX.1's plan: FSDP over every parameter's first dimension (no tensor parallelism yet: the single-stream
blocks fuse q, k, v and the MLP input in one matrix, which needs a packed split)."""
