"""A user's first job, for each published shape (``tests/published_shapes.py``): take a Hugging Face checkpoint
folder, import it, fine-tune it with one command (``--model.init-from DIR --data.path ...``), and load the export
in transformers with the checkpoint's tokenizer.

The model the command builds from the folder gives transformers' logits (fp32) before any training; the export
holds the trained weights (transformers' logits equal titanpod's on the run's model folder, and no longer the
source's) and the source's tokenizer and chat template.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tests.published_shapes import CORPUS, SHAPES, save_published
from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.data.tokenizer import BUILTIN
from titanpod.device import get_backend
from titanpod.models import Transformer
from titanpod.posttrain.cli import main as posttrain_main
from titanpod.pretrain.cli import main as pretrain_main
from titanpod.pretrain.command import parse_recipe
from titanpod.pretrain.convert import main as convert_main
from titanpod.recipes.families import build_model, decoder_adapters
from titanpod.runs.init_from import build_pretrained_model, following, pretrained_for

TOKENS_BS = torch.tensor([[3, 17, 101, 250, 42, 7, 300, 5], [9, 8, 7, 6, 5, 4, 3, 2]])
"""Token ids below every test tokenizer's size."""
SAME = {"rtol": 1e-4, "atol": 1e-4}
"""fp32 parity with transformers: the same arithmetic in another order."""


def texts_file(folder: Path) -> Path:
    """A jsonl file of ``{"text": ...}`` documents."""
    path = folder / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in CORPUS * 20), encoding="utf-8")
    return path


def chats_file(folder: Path) -> Path:
    """A jsonl file of ``{"messages": [...]}`` records: a user turn and the assistant's answer."""
    path = folder / "chats.jsonl"
    records = [
        {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}]}
        for text in CORPUS * 10
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def common_flags(tmp_path: Path, source: Path) -> list[str]:
    """The flags of a 3-step CPU run from ``source`` with a Hugging Face export."""
    return [
        "--model.init-from", str(source),
        "--train.steps", "3", "--train.warmup-steps", "0", "--train.log-every", "1", "--train.lr", "1e-2",
        "--device.lane", "cpu", "--output.runs-dir", str(tmp_path / "runs"), "--output.run-name", "tuned",
        "--output.no-tensorboard", "--checkpoint.export-hf", "--checkpoint.no-at-end",
    ]  # fmt: skip


def read_model(folder: Path) -> Transformer:
    """A titanpod or Hugging Face model folder read into a whole fp32 model on the CPU."""
    pretrained = open_pretrained(str(folder), decoder_adapters())
    model = build_model(pretrained.family, pretrained.args)
    model.to_empty(device="cpu")
    pretrained.load_into(model)
    return model.eval()


def transformers_logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(TOKENS_BS).logits


def check_export(run: Path, source: Path, family: str) -> None:
    """The run's export loads in transformers with the source's tokenizer and chat template, and holds the trained
    weights of the run's model folder."""
    from transformers import AutoTokenizer

    exported, theirs = AutoTokenizer.from_pretrained(run / "hf"), AutoTokenizer.from_pretrained(source)
    assert exported.get_vocab() == theirs.get_vocab()
    assert exported.chat_template == theirs.chat_template
    assert exported.eos_token == theirs.eos_token
    with torch.no_grad():
        tuned = read_model(run / "model")(TOKENS_BS)
    after = transformers_logits(run / "hf")
    torch.testing.assert_close(after, tuned, **SAME)
    assert not torch.allclose(after, transformers_logits(source), **SAME)  # trained: no longer the source's
    assert json.loads((run / "recipe.json").read_text(encoding="utf-8"))["model"]["family"] == family


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_published_shape_imports_fine_tunes_in_one_command_and_loads_back_in_transformers(name, tmp_path):
    shape = SHAPES[name]
    source = save_published(shape, tmp_path / "source")
    before = transformers_logits(source)

    assert convert_main(["import", str(source), str(tmp_path / "imported")]) == 0
    with torch.no_grad():
        torch.testing.assert_close(read_model(tmp_path / "imported")(TOKENS_BS), before, **SAME)

    flags = [*common_flags(tmp_path, source), "--data.source", "jsonl", "--data.path", str(texts_file(tmp_path))]
    flags += ["--data.seq-len", "16", "--data.batch-size", "2"]
    recipe = parse_recipe(flags)  # the command's own recipe: llama3_debug, whatever the folder holds
    assert recipe is not None and recipe.model.flavor == "debug"
    folder = pretrained_for(recipe)
    assert folder is not None
    model, _ = build_pretrained_model(following(recipe, folder, BUILTIN), get_backend("cpu"), folder)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(TOKENS_BS), before, **SAME)

    assert pretrain_main(flags) == 0
    check_export(tmp_path / "runs" / "tuned", source, shape.family)


@pytest.mark.parametrize("name", ["Llama-3.2-1B", "SmolLM2-135M", "Qwen3-0.6B"])
def test_supervised_fine_tuning_of_a_published_shape_uses_its_tokenizer_and_chat_template(name, tmp_path):
    shape = SHAPES[name]
    source = save_published(shape, tmp_path / "source")
    flags = [*common_flags(tmp_path, source), "--data.source", "jsonl", "--data.path", str(chats_file(tmp_path))]
    flags += ["--data.seq-len", "128", "--data.batch-size", "2", "--eval.no-enabled"]
    assert posttrain_main(flags) == 0
    run = tmp_path / "runs" / "tuned"
    assert json.loads((run / "recipe.json").read_text(encoding="utf-8"))["data"]["tokenizer"] == str(source)
    check_export(run, source, shape.family)


def test_a_tokenizer_given_on_purpose_must_fit_the_checkpoints_vocabulary_and_is_named_when_not_its_own(
    tmp_path, capsys
):
    narrow = dataclasses.replace(SHAPES["Qwen3-0.6B"], config={**SHAPES["Qwen3-0.6B"].config, "vocab_size": 1024})
    source = save_published(narrow, tmp_path / "source")
    flags = [*common_flags(tmp_path, source), "--data.seq-len", "16", "--data.batch-size", "2"]
    assert pretrain_main([*flags, "--data.tokenizer", BUILTIN]) == 1  # the built-in tokenizer has 1,152 tokens
    error = capsys.readouterr().err
    assert "The tokenizer 'builtin' has 1,152 tokens but the model of model.init_from" in " ".join(error.split())
    assert "Leave --data.tokenizer unset to train with the checkpoint's own tokenizer" in " ".join(error.split())
    assert not (tmp_path / "runs" / "tuned").exists()  # refused before the run started

    other = save_published(SHAPES["Llama-3.2-1B"], tmp_path / "other")  # another vocabulary, which fits
    assert pretrain_main([*flags, "--data.tokenizer", str(other), "--output.run-name", "other"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"data.tokenizer '{other}'" in said and "is not the tokenizer of model.init_from" in said
    assert pretrain_main([*flags, "--output.run-name", "own"]) == 0  # unset: the checkpoint's own, nothing to say
    assert "is not the tokenizer of model.init_from" not in capsys.readouterr().out
