"""titanpod-convert's output folder: never a non-empty one without --overwrite, never one it would delete
from, never one inside its source; and a push with no network says so."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard

from titanpod.checkpoint import push, save_model
from titanpod.checkpoint.hub_errors import HubUnreachableError
from titanpod.models import DecoderArgs, Transformer
from titanpod.pretrain.convert import main as convert_main

ARGS = DecoderArgs(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=48)


def connection_error_class() -> type[Exception]:
    """What huggingface_hub's HTTP client raises when no connection can be made (httpx2's ``ConnectError``),
    or a stand-in of the same shape where that client is not installed."""
    try:
        from httpx2 import ConnectError
    except ImportError:
        return type("ConnectError", (type("TransportError", (Exception,), {}),), {})
    return ConnectError


@pytest.fixture
def checkpoint(tmp_path):
    with torch.device("meta"):
        model = Transformer(ARGS)
    model.to_empty(device="cpu")
    model.init_weights(0)
    save_model(model, "llama3", tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_export_into_a_non_empty_folder_is_refused_and_deletes_nothing(tmp_path, checkpoint, capsys):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    assert convert_main(["export", str(checkpoint), str(run)]) == 1
    error = capsys.readouterr().err
    assert str(run) in error and "--overwrite" in error and "not empty" in error
    assert sorted(path.name for path in run.iterdir()) == ["metrics.jsonl"]
    assert not list(run.parent.glob(".*partial*"))


def test_overwrite_replaces_only_what_export_writes(tmp_path, checkpoint):
    out = tmp_path / "hf"
    assert convert_main(["export", str(checkpoint), str(out), "--max-shard-size", "10KB"]) == 0
    shards = sorted(path.name for path in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    (out / "USAGE.md").write_text("my notes")
    (out / "README.md").write_text("an old card")
    (out / "notes").mkdir()
    assert convert_main(["export", str(checkpoint), str(out), "--overwrite"]) == 0
    # the earlier export's index and shards are superseded by the single file; the user's files stay,
    # and the model card is one of the files export writes
    names = {path.name for path in out.iterdir()}
    assert {"USAGE.md", "notes", "config.json", "model.safetensors"} <= names
    assert not names & {*shards, "model.safetensors.index.json"}
    assert (out / "USAGE.md").read_text() == "my notes"
    assert ModelCard.load(out / "README.md").data.library_name == "transformers"
    assert json.loads((out / "config.json").read_text())["hidden_size"] == ARGS.dim


def test_an_output_inside_the_source_or_holding_it_is_refused(tmp_path, checkpoint, capsys):
    assert convert_main(["export", str(checkpoint), str(checkpoint / "hf")]) == 1
    assert f"{checkpoint / 'hf'} is inside the source {checkpoint}" in capsys.readouterr().err
    assert convert_main(["export", str(checkpoint), str(tmp_path), "--overwrite"]) == 1
    assert f"The source {checkpoint} is inside the output folder {tmp_path}" in capsys.readouterr().err
    assert not (checkpoint / "hf").exists() and not (tmp_path / "config.json").exists()


def test_import_into_a_non_empty_folder_is_refused_before_reading_the_source(tmp_path, capsys):
    out = tmp_path / "existing"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert convert_main(["import", str(tmp_path / "no-such-source"), str(out)]) == 1
    assert f"The output folder {out} is not empty" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"


def test_push_without_network_names_the_hub_repository_and_what_to_do(tmp_path, checkpoint, monkeypatch, capsys):
    from huggingface_hub import HfApi

    out = tmp_path / "hf"
    assert convert_main(["export", str(checkpoint), str(out)]) == 0
    connect_error = connection_error_class()

    def unreachable(self, *args, **kwargs):
        raise connect_error("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "create_repo", unreachable)
    capsys.readouterr()
    assert convert_main(["push", str(out), "acme/tiny"]) == 1
    error = capsys.readouterr().err
    assert "could not be reached" in error and "huggingface.co/acme/tiny" in error and "HF_HUB_OFFLINE" in error
    assert "Traceback" not in error
    with pytest.raises(HubUnreachableError, match="Name or service not known"):
        push(out, "acme/tiny")
