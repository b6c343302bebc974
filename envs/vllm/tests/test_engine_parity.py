"""titanpod's vLLM engine against the real vLLM (CPU build): the weights it samples from are the trainer's, for a
model with its own output head and one whose head is tied to its embedding."""

from __future__ import annotations

import pytest
from conftest import HERE, MODELS, read_json, run_python

FP32_TOLERANCE = 1e-3
"""fp32: vLLM's kernels and titanpod's forward differ only in summation order (measured: about 1e-6)."""


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """The figures ``engine_parity.py`` measured, in a process of its own."""
    where = tmp_path_factory.mktemp("parity")
    run_python(str(HERE / "engine_parity.py"), str(where / "figures.json"), cwd=HERE)
    return read_json(where / "figures.json")


FAMILIES = pytest.mark.parametrize("family", list(MODELS))


@FAMILIES
def test_the_engine_started_from_the_export_scores_as_the_trainer(figures, family):
    assert figures[family]["start"] <= FP32_TOLERANCE, figures[family]


@FAMILIES
def test_before_the_push_the_engine_still_holds_the_old_weights(figures, family):
    assert figures[family]["stale"] > 100 * FP32_TOLERANCE, figures[family]


@FAMILIES
def test_after_the_push_the_engine_scores_and_samples_as_the_trainer(figures, family):
    assert figures[family]["pushed"] <= FP32_TOLERANCE, figures[family]
    assert figures[family]["sampled"] <= FP32_TOLERANCE and figures[family]["sampled_tokens"] > 0, figures[family]


@FAMILIES
def test_the_push_reports_what_went_to_the_engine(figures, family):
    import torch

    from titanpod.models import Transformer, parameter_count

    with torch.device("meta"):
        parameters = parameter_count(Transformer(MODELS[family]))
    push = figures[family]["push"]
    assert push["version"] == 1 and push["dtype"] == "float32" and push["checksum_equal"], push
    assert push["bytes"] == 4 * parameters, (push, parameters)


def test_a_head_size_the_cpu_build_cannot_run_is_refused_before_vllm_starts():
    import dataclasses

    import torch
    from conftest import TINY

    from titanpod.models import Transformer
    from titanpod.rl.rollout.vllm_engine import VLLMEngine

    with torch.device("meta"):
        model = Transformer(dataclasses.replace(TINY, n_heads=4, n_kv_heads=2))  # head size 16, as llama3 debug's
    with pytest.raises(ValueError, match=r"attention takes head sizes \[32, 64.*the model's is 16"):
        VLLMEngine(model, "llama3", dtype="float32")
