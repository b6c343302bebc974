"""``data.tokenizer_revision``: a Hub tokenizer is downloaded at the revision asked for, and checkpoints written
before the field existed still resume while it is unset."""

from __future__ import annotations

import dataclasses

import pytest

from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.recipe_changes import check_same_run
from titanpod.data import DataConfig, builtin_tokenizer_path, resolve_tokenizer


def test_a_hub_tokenizer_is_downloaded_at_the_revision(monkeypatch):
    import huggingface_hub

    asked: list[tuple[str, str, str | None]] = []

    def download(repo_id, filename, revision=None, **kwargs):
        asked.append((repo_id, filename, revision))
        return str(builtin_tokenizer_path())

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    tokenizer = resolve_tokenizer("acme/tokenizer", "v2")
    assert tokenizer.token_to_id("<|endoftext|>") is not None
    resolve_tokenizer("acme/tokenizer")
    assert asked == [("acme/tokenizer", "tokenizer.json", "v2"), ("acme/tokenizer", "tokenizer.json", None)]


def test_a_checkpoint_older_than_the_field_resumes_while_it_is_unset():
    current = {"data": dataclasses.asdict(DataConfig())}
    saved = {"data": {key: value for key, value in current["data"].items() if key != "tokenizer_revision"}}
    assert check_same_run(saved, current, "here") == []
    pinned = {"data": {**current["data"], "tokenizer_revision": "v2"}}
    with pytest.raises(CheckpointError, match=r"data.tokenizer_revision: <absent> -> 'v2'"):
        check_same_run(saved, pinned, "here")
