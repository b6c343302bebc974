"""GGUF files in: titanpod's model read from a GGUF equals transformers' own load of the same file (logits within
1e-5 in fp32, tokenizer ids equal), as a Hugging Face folder, through ``--model.init-from`` and ``titanpod-convert
gguf``; files it cannot use are refused in one line naming the file, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.gguf_models import write_gguf
from titanpod.checkpoint import load_hf_checkpoint
from titanpod.checkpoint.gguf_files import GgufError, check_gguf, gguf_as_hf_folder, write_gguf_as_hf
from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.data import builtin_corpus_path
from titanpod.data.sft.tokenizer import load_sft_tokenizer
from titanpod.pretrain.convert import main as convert_main
from titanpod.recipes.families import decoder_adapters

QWEN3_HEAD_DIM = 32
"""The tiny Qwen 3's head width, which its file states (transformers would read 128 without being told)."""


def transformers_load(path: Path, family: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stated = {"head_dim": QWEN3_HEAD_DIM} if family == "qwen3" else {}
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, **stated)
    return model.eval(), AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def prompts() -> list[str]:
    """Real text (the built-in corpus) and a chat turn with the template's special tokens."""
    text = builtin_corpus_path().read_text(encoding="utf-8")
    return [text[:300], text[5000:5400], "Ann has 7 pens. She gets 5 more. How many pens does Ann have?\n"]


@pytest.mark.parametrize(("family", "weight_type"), [("llama3", "Q4_1"), ("qwen3", "Q8_0"), ("llama3", "F16")])
def test_logits_and_tokens_equal_transformers_own_load_of_the_gguf(tmp_path, family, weight_type):
    path = write_gguf(tmp_path / "src" / "model.gguf", family, weight_type=weight_type, seed=3)
    read = write_gguf_as_hf(path, tmp_path / "hf", decoder_adapters())
    assert read.family == family
    ours = load_hf_checkpoint(tmp_path / "hf", adapters=decoder_adapters()).model.eval()
    theirs, their_tokenizer = transformers_load(path, family)

    tokenizer = load_sft_tokenizer(str(tmp_path / "hf"))
    chat = tokenizer.render_chat([{"role": "user", "content": prompts()[2]}], add_generation_prompt=True)
    assert chat == their_tokenizer.apply_chat_template(
        [{"role": "user", "content": prompts()[2]}], add_generation_prompt=True, tokenize=False
    )
    texts = [*prompts(), chat]
    ids = [tokenizer.encode(text) for text in texts]
    assert ids == [their_tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    assert ids[3][0] == tokenizer.tokenizer.token_to_id("<|im_start|>")  # special tokens stay whole

    length = min(len(row) for row in ids)
    batch = torch.tensor([row[:length] for row in ids])
    with torch.no_grad():
        expected = theirs(batch).logits
        got = ours(batch)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_init_from_takes_the_gguf_file_or_its_folder_and_converts_it_once(tmp_path):
    path = write_gguf(tmp_path / "models" / "tiny.gguf", "qwen3")
    said: list[str] = []
    opened = open_pretrained(str(path), decoder_adapters(), progress=said.append)
    assert opened.kind == "gguf" and opened.family == "qwen3" and opened.source == str(path)
    assert opened.args.resolved_head_dim == QWEN3_HEAD_DIM and opened.args.tie_embeddings
    assert opened.tokenizer_folder == opened.directory and "GGUF file" in opened.describe()
    assert any("converted" in line for line in said)
    weights = opened.directory / "model.safetensors"
    written = weights.stat().st_mtime_ns

    said.clear()
    again = open_pretrained(str(path.parent), decoder_adapters(), progress=said.append)  # the folder holding it
    assert again.directory == opened.directory and weights.stat().st_mtime_ns == written and not said

    path.write_bytes(write_gguf(tmp_path / "other.gguf", "qwen3", seed=1).read_bytes())  # new content, same name
    assert gguf_as_hf_folder(path, decoder_adapters()) != opened.directory


def test_convert_gguf_writes_a_folder_transformers_loads(tmp_path, capsys):
    path = write_gguf(tmp_path / "src" / "tiny.gguf", "llama3")
    assert convert_main(["gguf", str(path), str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    said = capsys.readouterr().out
    assert "converted llama3" in said and "tokenizer.json" in said
    files = {child.name for child in (tmp_path / "out").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= files

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert model.dtype == torch.bfloat16
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template is not None


def refusal(tmp_path: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``titanpod-convert gguf`` says of ``path``, checking it exits 1 and writes nothing."""
    assert convert_main(["gguf", str(path), str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()
    with pytest.raises(GgufError) as error:
        check_gguf(path)
    message = capsys.readouterr().err
    assert str(path) in message
    return str(error.value)


def test_a_file_that_is_not_gguf_or_is_cut_short_is_named(tmp_path, capsys):
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    assert "is not a GGUF file" in refusal(tmp_path, text, capsys)
    whole = write_gguf(tmp_path / "whole.gguf", "llama3").read_bytes()
    for cut in (len(whole) // 2, len(whole) - 100, 4000):
        short = tmp_path / f"short-{cut}.gguf"
        short.write_bytes(whole[:cut])
        assert "likely cut short or damaged" in refusal(tmp_path, short, capsys)


def test_an_architecture_without_a_family_is_named(tmp_path, capsys):
    path = write_gguf(tmp_path / "phi.gguf", "llama3", architecture="phi2")
    message = refusal(tmp_path, path, capsys)
    assert "'phi2'" in message and "llama, qwen3 (Llama 3, Qwen 3)" in message


def test_a_quantization_gguf_cannot_dequantize_is_named(tmp_path, capsys):
    path = write_gguf(tmp_path / "odd.gguf", "llama3", odd_tensor="blk.1.ffn_up.weight")
    message = refusal(tmp_path, path, capsys)
    assert "I32 (1 tensors, e.g. blk.1.ffn_up.weight)" in message and "cannot dequantize" in message


def test_a_gguf_without_its_tokenizer_is_refused(tmp_path, capsys):
    path = write_gguf(tmp_path / "bare.gguf", "llama3", tokenizer=False)
    assert "holds no tokenizer" in refusal(tmp_path, path, capsys)


def test_a_folder_of_several_gguf_files_and_a_missing_file_are_named(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        write_gguf(tmp_path / "two" / name, "llama3")
    with pytest.raises(GgufError, match="holds 2 GGUF files"):
        open_pretrained(str(tmp_path / "two"), decoder_adapters())
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        open_pretrained(str(tmp_path / "missing.gguf"), decoder_adapters())


def test_a_fine_tune_from_a_gguf_file_trains_on_chats_with_its_template_and_tokenizer(tmp_path):
    from titanpod.posttrain.cli import main as posttrain_main
    from titanpod.recipes.posttrain.fine_tune_length import checkpoint_seq_len

    path = write_gguf(tmp_path / "tiny.gguf", "llama3")
    assert checkpoint_seq_len(str(path)) == 256  # the file's context length
    chats = tmp_path / "chats.jsonl"
    chat = [{"role": "user", "content": "How many pens?"}, {"role": "assistant", "content": "Twelve pens."}]
    chats.write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(8)), encoding="utf-8")
    argv = [
        "--model.init-from", str(path), "--data.source", "jsonl", "--data.path", str(chats), "--train.steps", "2",
        "--data.batch-size", "1", "--eval.no-enabled", "--device.lane", "cpu", "--output.runs-dir",
        str(tmp_path / "runs"), "--output.run-name", "tuned", "--output.no-tensorboard",
    ]  # fmt: skip
    assert posttrain_main(argv) == 0
    run = tmp_path / "runs" / "tuned"
    recipe = json.loads((run / "recipe.json").read_text(encoding="utf-8"))
    assert recipe["model"]["family"] == "llama3" and recipe["data"]["seq_len"] == 256
    assert Path(recipe["data"]["tokenizer"]) == open_pretrained(str(path), decoder_adapters()).directory
    saved = json.loads((run / "model" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "<|im_start|>" in saved["chat_template"]
