"""The README's fine-tune command on a user's chats (``--model.init-from DIR --data.source jsonl --data.path
chats.jsonl``): rows as long as the checkpoint takes rather than the toy recipe's 64, and chats with a tokenizer
that has no chat template refused before the weights are read, with advice that works."""

from __future__ import annotations

import json
from pathlib import Path

from tests.published_shapes import SHAPES, save_published
from titanpod.posttrain.cli import main as posttrain_main
from titanpod.posttrain.command import parse_command
from titanpod.recipes.posttrain.fine_tune_length import PUBLISHED_SEQ_LEN, checkpoint_seq_len

CHAT = [
    {"role": "system", "content": "You answer questions about packing sequences for training, briefly."},
    {"role": "user", "content": "Why are whole examples packed into a row instead of cut at its end?"},
    {"role": "assistant", "content": "So that no example is split across two rows and the loss sees each whole."},
]
"""Three messages: far more than 64 tokens once rendered by any chat template."""


def chats_file(folder: Path, records: int = 8) -> Path:
    path = folder / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": CHAT}) + "\n" for _ in range(records)), encoding="utf-8")
    return path


def readme_command(source: Path, tmp_path: Path) -> list[str]:
    """The README's fine-tune command, made short: one step, one row a batch, no evaluation or checkpoint."""
    return [
        "--model.init-from", str(source), "--data.source", "jsonl", "--data.path", str(chats_file(tmp_path)),
        "--train.steps", "1", "--data.batch-size", "1", "--eval.no-enabled", "--checkpoint.no-at-end",
        "--device.lane", "cpu", "--output.runs-dir", str(tmp_path / "runs"), "--output.run-name", "tuned",
        "--output.no-tensorboard",
    ]  # fmt: skip


def test_the_sequence_length_of_a_fine_tune_is_the_checkpoints(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "recipe.json").write_text(json.dumps({"name": "llama3_debug", "data": {"seq_len": 256}}))
    published = tmp_path / "published"
    published.mkdir()
    (published / "config.json").write_text(json.dumps({"max_position_embeddings": 40960}))
    short = tmp_path / "short"
    short.mkdir()
    (short / "config.json").write_text(json.dumps({"max_position_embeddings": 300}))
    assert checkpoint_seq_len(str(ours)) == 256  # a titanpod checkpoint: the length it was trained at
    assert checkpoint_seq_len(str(published)) == PUBLISHED_SEQ_LEN  # a published one: as long as fits here
    assert checkpoint_seq_len(str(short)) == 300
    assert checkpoint_seq_len("Qwen/Qwen3-0.6B") is None  # a Hub id: the recipe's, until it is fetched

    assert parse_command([]).recipe.data.seq_len == 64  # the toy recipe alone
    assert parse_command(["--model.init-from", str(ours)]).recipe.data.seq_len == 256
    assert parse_command(["--model.init-from", str(published)]).recipe.data.seq_len == PUBLISHED_SEQ_LEN
    given = parse_command(["--model.init-from", str(ours), "--data.seq-len", "96"]).recipe
    assert given.data.seq_len == 96  # the user's own wins


def test_the_readme_fine_tune_command_trains_on_chats_longer_than_64_tokens(tmp_path):
    source = save_published(SHAPES["SmolLM2-135M"], tmp_path / "source")
    assert posttrain_main(readme_command(source, tmp_path)) == 0
    recipe = json.loads((tmp_path / "runs" / "tuned" / "recipe.json").read_text(encoding="utf-8"))
    assert recipe["data"]["seq_len"] == PUBLISHED_SEQ_LEN


def test_chats_and_a_tokenizer_without_a_chat_template_are_refused_before_the_weights_are_read(tmp_path, capsys):
    source = save_published(SHAPES["SmolLM2-135M"], tmp_path / "source")
    (source / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    (source / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")

    assert posttrain_main([*readme_command(source, tmp_path), "--data.bad-examples", "skip"]) == 1
    said = capsys.readouterr()
    error = " ".join(said.err.split())
    assert "has no chat template" in error and "--data.format plain" in error
    assert "--data.bad-examples skip" not in error  # skipping would skip every record
    assert "reading the weights" not in said.out
    assert not (tmp_path / "runs" / "tuned").exists()
