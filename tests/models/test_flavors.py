"""Every flavor's shape gives the published parameter totals (shared/REFERENCE.md)."""

from __future__ import annotations

import pytest

from titanpod.models import parameter_count
from titanpod.recipes.families import MODEL_SPECS, build_model

PUBLISHED_TOTALS = {
    ("llama3", "1B"): "1.236",
    ("llama3", "3B"): "3.213",
    ("llama3", "8B"): "8.030",
    ("llama3", "70B"): "70.554",
    ("llama3", "405B"): "405.853",
    ("qwen3", "0.6B"): "0.596",
    ("qwen3", "1.7B"): "1.721",
    ("qwen3", "4B"): "4.022",
    ("qwen3", "8B"): "8.191",
    ("qwen3", "14B"): "14.768",
    ("qwen3", "32B"): "32.762",
    ("qwen3_moe", "30B-A3B"): "30.53",
    ("qwen3_moe", "235B-A22B"): "235.09",
}
PUBLISHED_ACTIVE = {("qwen3_moe", "30B-A3B"): "3.35", ("qwen3_moe", "235B-A22B"): "22.19"}
"""Billions, as published; a count matches when it rounds to the published digits."""


def matches_published(count: int, billions: str) -> bool:
    decimals = len(billions.split(".")[1])
    return round(count / 1e9, decimals) == float(billions)


@pytest.mark.parametrize(("family", "flavor"), sorted(PUBLISHED_TOTALS))
def test_parameter_totals_match_the_published_models(family, flavor):
    model = build_model(family, flavor)  # meta device: nothing allocated
    assert matches_published(parameter_count(model), PUBLISHED_TOTALS[family, flavor])


@pytest.mark.parametrize(("family", "flavor"), sorted(PUBLISHED_ACTIVE))
def test_moe_active_parameters_match_the_published_models(family, flavor):
    model = build_model(family, flavor)
    assert matches_published(model.active_parameter_count(), PUBLISHED_ACTIVE[family, flavor])


def test_every_family_has_a_debug_flavor_and_the_listed_sizes():
    assert {name: set(family.flavors) for name, family in MODEL_SPECS.items()} == {
        "llama3": {"debug", "1B", "3B", "8B", "70B", "405B"},
        "qwen3": {"debug", "0.6B", "1.7B", "4B", "8B", "14B", "32B"},
        "qwen3_moe": {"debug", "30B-A3B", "235B-A22B"},
        "flux": {"debug", "dev", "schnell"},
    }


def test_llama3_8b_flops_per_token_by_hand():
    model = build_model("llama3", "8B")
    non_embedding = 8_030_261_248 - 128256 * 4096
    assert parameter_count(model) == 8_030_261_248
    assert model.flops_per_token(8192) == 6 * non_embedding + 12 * 32 * 32 * 128 * 8192


def test_moe_flops_count_only_active_experts():
    model = build_model("qwen3_moe", "235B-A22B")
    args, moe = model.args, model.args.moe
    assert moe is not None
    inactive = args.n_layers * (moe.n_experts - moe.top_k) * 3 * args.dim * moe.expert_ffn_dim
    matmul = parameter_count(model) - inactive - args.vocab_size * args.dim
    assert model.flops_per_token(4096) == 6 * matmul + 12 * args.n_layers * args.n_heads * 128 * 4096
