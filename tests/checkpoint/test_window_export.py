"""A model trained with ``kernels.window`` exports with its window, or not at all.

transformers' Qwen 3 classes attend through config.json's sliding window; its Llama class has none, so a Llama
trained with a window is refused before anything is written rather than exported to give other logits.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.checkpoint.test_hf_parity import transformers_model
from titanpod.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from titanpod.kernels import KernelConfig, model_ops
from titanpod.models.adapters.base import UnsupportedConfigError
from titanpod.recipes.families import build_model, decoder_adapters, hf_adapter

WINDOW = 8
"""Keys before each query: far fewer than the 64 tokens of each row."""


def windowed(family: str, folder) -> torch.nn.Module:
    """The model in ``folder`` attending through ``WINDOW`` (the sdpa lane's local attention)."""
    loaded = load_hf_checkpoint(folder, adapters=decoder_adapters())
    model = build_model(family, loaded.model.args, model_ops(KernelConfig(window=WINDOW)))
    model.to_empty(device="cpu")
    model.init_weights()  # the buffers (rotary angles); the weights are then the checkpoint's
    model.load_state_dict(loaded.model.state_dict())
    return model.eval()


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_the_export_of_a_windowed_model_gives_its_logits_in_transformers(family, hf_checkpoints, real_token_ids,
                                                                          tmp_path):  # fmt: skip
    model = windowed(family, hf_checkpoints[family])
    out = save_hf_checkpoint(model, hf_adapter(family), tmp_path / "export", attention_window=WINDOW)
    config = json.loads((out / "config.json").read_text())
    assert config["use_sliding_window"] and config["sliding_window"] == WINDOW + 1
    with torch.no_grad():
        ours = model(real_token_ids)
        theirs = transformers_model(family, out)(real_token_ids).logits
        unwindowed = transformers_model(family, hf_checkpoints[family])(real_token_ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert (ours - unwindowed).abs().max().item() > 1e-2  # the window changes the logits this test compares


def test_a_llama_trained_with_a_window_is_refused_before_anything_is_written(hf_checkpoints, tmp_path):
    model = windowed("llama3", hf_checkpoints["llama3"])
    with pytest.raises(UnsupportedConfigError, match=r"^kernels\.window 8: transformers' LlamaForCausalLM has no"):
        save_hf_checkpoint(model, hf_adapter("llama3"), tmp_path / "export", attention_window=WINDOW)
    assert not (tmp_path / "export").exists()
