"""titanpod-convert writes complete Hugging Face folders: tokenizer, generation config, special token ids, card.

A tiny transformers Llama with bos 200, eos [201, 202] and pad 203 and its own tokenizer goes in through
``import`` and comes back out through ``export``; a tiny pretraining run's trainer checkpoint exports to the
same tensors as the run's final model folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from titanpod.checkpoint.hf_files import iter_hf_tensors
from titanpod.pretrain.cli import main as pretrain_main
from titanpod.pretrain.convert import main as convert_main

VOCAB = 256
BOS, EOS, PAD = 200, [201, 202], 203
SPECIALS = {"<s>": 200, "</s>": 201, "<|eot|>": 202, "<pad>": 203}


def tiny_tokenizer():
    """A word-level tokenizer: ``<unk>``, words ``w1`` .. ``w199``, then the four special tokens at 200-203."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 200)}, **SPECIALS}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def source_model(folder: Path) -> Path:
    """A tiny Llama whose every next token is 202 (the second eos), saved with its tokenizer.

    Attention and MLP outputs are zeroed, so the last hidden state is the embedding; every embedding is large
    in dimension 0 alone and only the lm_head row of 202 reads that dimension.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.mul_(0.01)[:, 0] = 1.0
        model.lm_head.weight.zero_()[EOS[1], 0] = 10.0
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def json_of(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_import_then_export_keeps_tokenizer_ids_and_generation(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = source_model(tmp_path / "source")
    assert convert_main(["import", str(source), str(tmp_path / "ours")]) == 0
    assert (tmp_path / "ours" / "tokenizer.json").is_file()
    assert convert_main(["export", str(tmp_path / "ours"), str(tmp_path / "back")]) == 0
    back = tmp_path / "back"

    for name in ("config.json", "generation_config.json"):
        ids = json_of(back / name)
        assert (ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"]) == (BOS, EOS, PAD), name

    tokenizer = AutoTokenizer.from_pretrained(back)
    text = "w5 w17 <|eot|> w199"
    assert tokenizer(text)["input_ids"] == tiny_tokenizer()(text)["input_ids"] == [5, 17, 202, 199]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (200, 201, 203)

    model = AutoModelForCausalLM.from_pretrained(back).eval()
    prompt = torch.tensor([[BOS, 5, 17]])
    generated = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert generated[0].tolist() == [BOS, 5, 17, 202]  # stopped at the second eos id, not after 8 tokens

    card = (back / "README.md").read_text(encoding="utf-8")
    assert f"| imported from | a local folder ({source.name}) |" in card and "| family | llama3 |" in card
    assert str(tmp_path) not in card  # a folder of this machine is never named
    metadata = ModelCard.load(back / "README.md").data
    assert metadata.license == "unknown" and metadata.base_model is None  # imported weights keep their own


def test_trainer_checkpoint_exports_the_same_tensors_as_the_run_model(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.chdir(tmp_path)
    short_run = ["--train.steps", "2", "--train.warmup-steps", "1", "--data.seq-len", "16", "--data.batch-size", "2"]
    assert pretrain_main([*short_run, "--output.run-name", "r"]) == 0
    run = tmp_path / "runs" / "r"
    step = run / "checkpoints" / "step-000002"
    assert convert_main(["export", str(step), str(tmp_path / "from-step")]) == 0
    assert convert_main(["export", str(run), str(tmp_path / "from-run")]) == 0  # the run's model/ folder

    from_step = dict(iter_hf_tensors(tmp_path / "from-step"))
    from_run = dict(iter_hf_tensors(tmp_path / "from-run"))
    assert from_step.keys() == from_run.keys() and len(from_step) > 10
    for name, tensor in from_run.items():
        assert torch.equal(from_step[name], tensor), name

    builtin = AutoTokenizer.from_pretrained(tmp_path / "from-step")
    assert builtin.eos_token == "<|endoftext|>"
    assert json_of(tmp_path / "from-step" / "generation_config.json")["eos_token_id"] == builtin.eos_token_id
    last_loss = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["loss"]
    for folder in ("from-step", "from-run"):
        card = (tmp_path / folder / "README.md").read_text(encoding="utf-8")
        assert "| training steps | 2 |" in card and f"| final training loss (last logged) | {last_loss:.4f} |" in card
        assert '"flavor": "debug"' in card  # the recipe, as JSON
        assert str(tmp_path) not in card and "PATH_OR_REPO" not in card
        metadata = ModelCard.load(tmp_path / folder / "README.md").data
        assert (metadata.license, metadata.datasets, metadata.base_model) == ("apache-2.0", ["titanpod-builtin"], None)
        assert metadata.tags == ["titanpod", "llama3", "pretraining"]
        assert metadata.eval_results[0].metric_value == pytest.approx(last_loss, abs=1e-6)
    assert "| training tokens | 64 |" in (tmp_path / "from-run" / "README.md").read_text()  # 2 steps x 2 x 16


def test_push_hands_revision_pr_message_and_visibility_to_the_hub(tmp_path, monkeypatch):
    import huggingface_hub

    calls: list[tuple[str, dict]] = []

    def recorder(name):
        def record(self, *args, **kwargs):
            calls.append((name, {**({"repo_id": args[0]} if args else {}), **kwargs}))

        return record

    for name in ("create_repo", "create_branch", "upload_folder"):
        monkeypatch.setattr(huggingface_hub.HfApi, name, recorder(name))
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "README.md").write_text("# card")

    args = ["push", str(folder), "acme/tiny", "--branch", "dev", "--commit-message", "step 2", "--public"]
    assert convert_main(args) == 0
    assert calls == [
        ("create_repo", {"repo_id": "acme/tiny", "private": False, "exist_ok": True, "repo_type": "model"}),
        ("create_branch", {"repo_id": "acme/tiny", "branch": "dev", "exist_ok": True, "repo_type": "model"}),
        ("upload_folder", {"repo_id": "acme/tiny", "folder_path": str(folder), "commit_message": "step 2",
                           "repo_type": "model", "revision": "dev", "create_pr": False}),
    ]  # fmt: skip

    calls.clear()
    assert convert_main(["push", str(folder), "acme/tiny", "--revision", "main", "--create-pr"]) == 0
    assert [name for name, _ in calls] == ["create_repo", "upload_folder"]  # a PR needs no branch of its own
    assert calls[0][1]["private"] is True
    assert calls[1][1] == {"repo_id": "acme/tiny", "folder_path": str(folder), "repo_type": "model",
                           "commit_message": "Upload from titanpod", "revision": "main", "create_pr": True}  # fmt: skip


def test_post_training_tokenizer_exports_its_chat_template_and_both_stop_ids(tmp_path):
    from transformers import AutoTokenizer

    from titanpod.data.tokenizer_export import tokenizer_export

    export = tokenizer_export("chars")  # what an SFT run on the built-in tokenizer writes beside its weights
    for name, text in export.files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    stops = tuple(tokenizer.convert_tokens_to_ids(name) for name in ("<|endoftext|>", "<|im_end|>"))
    assert export.eos_id == stops and export.pad_id == tokenizer.pad_token_id == 0  # <|pad|>
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    assert tokenizer.decode(tokenizer("abc")["input_ids"]) == "abc"
