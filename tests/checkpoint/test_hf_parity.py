"""Hugging Face checkpoints in and out, checked against transformers itself.

Tolerances: fp32 logits within 1e-4 absolute (they match to the last bit on this CPU);
bf16 logits deviate from the fp32 reference by at most 1.25x transformers' own bf16
deviation plus 1e-3, since both round the same computation to bf16.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tests.checkpoint.conftest import FAMILIES
from titanpod.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from titanpod.checkpoint.hf_files import iter_hf_tensors
from titanpod.models import IGNORE_INDEX
from titanpod.recipes.families import decoder_adapters, hf_adapter


def shifted_labels(ids: torch.Tensor) -> torch.Tensor:
    return torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), IGNORE_INDEX)], dim=1)


def transformers_model(family: str, folder, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_logits_and_loss_match_transformers(family, hf_checkpoints, real_token_ids):
    folder = hf_checkpoints[family]
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1  # really sharded
    reference = transformers_model(family, folder)
    loaded = load_hf_checkpoint(folder, adapters=decoder_adapters())
    assert loaded.family == family
    with torch.no_grad():
        expected = reference(real_token_ids, labels=real_token_ids)
        logits = loaded.model(real_token_ids)
        loss = loaded.model.loss(real_token_ids, shifted_labels(real_token_ids))
    assert (logits - expected.logits).abs().max().item() <= 1e-4
    torch.testing.assert_close(loss, expected.loss, atol=1e-5, rtol=1e-5)
    if family == "qwen3_moe":  # transformers adds router_aux_loss_coef x aux_loss to its loss
        terms = loaded.model.loss_terms(real_token_ids, shifted_labels(real_token_ids))
        torch.testing.assert_close(terms["load_balancing"], expected.aux_loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_deviation_is_no_worse_than_transformers(family, hf_checkpoints, real_token_ids):
    folder = hf_checkpoints[family]
    with torch.no_grad():
        reference = transformers_model(family, folder)(real_token_ids).logits
        theirs = transformers_model(family, folder, torch.bfloat16)(real_token_ids).logits.float()
        model = load_hf_checkpoint(folder, dtype=torch.bfloat16, adapters=decoder_adapters()).model
        assert model.tok_embeddings.weight.dtype == torch.bfloat16
        ours = model(real_token_ids).float()
    their_error = (theirs - reference).abs().max().item()
    our_error = (ours - reference).abs().max().item()
    assert our_error <= 1.25 * their_error + 1e-3, (our_error, their_error)


@pytest.mark.parametrize("family", FAMILIES)
def test_export_loads_in_transformers_and_round_trips_bit_exactly(family, hf_checkpoints, real_token_ids, tmp_path):
    folder = hf_checkpoints[family]
    loaded = load_hf_checkpoint(folder, adapters=decoder_adapters())
    out = save_hf_checkpoint(loaded.model, hf_adapter(loaded.family), tmp_path / "export", max_shard_size="60KB")

    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for _, t in iter_hf_tensors(out))
    for shard in shards:
        with safe_open(str(out / shard), framework="pt") as handle:
            assert handle.metadata() == {"format": "pt"}

    original = dict(iter_hf_tensors(folder))
    exported = dict(iter_hf_tensors(out))
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name

    with torch.no_grad():
        expected = transformers_model(family, folder)(real_token_ids).logits
        again = transformers_model(family, out)(real_token_ids).logits
    assert (again - expected).abs().max().item() <= 1e-4


def test_exported_config_reads_back_to_the_same_shape(hf_checkpoints, tmp_path):
    from titanpod.models.adapters import adapter_of_hf_config

    for family in FAMILIES:
        loaded = load_hf_checkpoint(hf_checkpoints[family], adapters=decoder_adapters())
        out = save_hf_checkpoint(loaded.model, hf_adapter(family), tmp_path / family)
        config = json.loads((out / "config.json").read_text())
        adapter = adapter_of_hf_config(config, decoder_adapters())
        assert (adapter.family, adapter.args_from_hf_config(config)) == (family, loaded.model.args)
        assert (out / "model.safetensors").is_file()  # one shard under the default 5 GB limit
