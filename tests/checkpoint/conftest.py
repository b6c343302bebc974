"""Checkpoints built by transformers itself, shared by the Hugging Face tests of this folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.hf_models import hf_model, save_sharded
from titanpod.data import builtin_corpus_path, builtin_tokenizer_path, load_tokenizer

FAMILIES = ("llama3", "qwen3", "qwen3_moe")


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> folder of a sharded checkpoint written by ``save_pretrained``."""
    root = tmp_path_factory.mktemp("hf")
    return {family: save_sharded(hf_model(family), root / family) for family in FAMILIES}


@pytest.fixture(scope="session")
def real_token_ids() -> torch.Tensor:
    """[4, 64] ids of real text from the built-in corpus, encoded by the built-in tokenizer."""
    tokenizer = load_tokenizer(builtin_tokenizer_path())
    ids = tokenizer.encode(builtin_corpus_path().read_text(encoding="utf-8")[:5000]).ids[:256]
    return torch.tensor(ids).view(4, 64)
