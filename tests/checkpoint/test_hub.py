"""Hub pull and push, as far as they run without the Hub.

Pull is exercised for real against a cache folder laid out as huggingface_hub lays it out
(in tests/apps/test_convert_cli.py, with HF_HUB_OFFLINE=1). Push is checked up to the
calls it makes: the Hub itself is out of reach here, so a recording stand-in takes them.
"""

from __future__ import annotations

import shutil

import pytest

from titanpod.checkpoint import push, resolve_source


class RecordingApi:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))


def test_push_creates_the_repository_then_uploads_the_folder(hf_checkpoints):
    api = RecordingApi()
    folder = hf_checkpoints["qwen3"]
    files = push(folder, "acme/tiny-qwen3", api=api)
    assert files[:2] == ["config.json", "model.safetensors.index.json"]
    assert len([f for f in files if f.endswith(".safetensors")]) == len(list(folder.glob("*.safetensors")))
    assert api.calls == [
        ("create_repo", {"repo_id": "acme/tiny-qwen3", "private": True, "exist_ok": True, "repo_type": "model"}),
        ("upload_folder", {"repo_id": "acme/tiny-qwen3", "folder_path": str(folder),
                           "commit_message": "Upload from titanpod", "repo_type": "model", "revision": None,
                           "create_pr": False}),
    ]  # fmt: skip


def test_push_refuses_an_incomplete_folder_before_touching_the_hub(hf_checkpoints, tmp_path):
    folder = tmp_path / "partial"
    shutil.copytree(hf_checkpoints["llama3"], folder)
    lost = sorted(folder.glob("model-*.safetensors"))[1]
    lost.unlink()
    api = RecordingApi()
    with pytest.raises(FileNotFoundError, match=f"lacks shards listed in its index: {lost.name}"):
        push(folder, "acme/x", api=api)
    assert api.calls == []
    with pytest.raises(FileNotFoundError, match="has no config"):
        push(tmp_path, "acme/x", api=api)


def test_resolve_source_takes_folders_and_rejects_what_is_neither(hf_checkpoints, tmp_path):
    assert resolve_source(str(hf_checkpoints["llama3"])) == hf_checkpoints["llama3"]
    with pytest.raises(FileNotFoundError, match="neither a local folder nor a Hub id"):
        resolve_source(str(tmp_path / "missing" / "deeper"))
    (tmp_path / "file.safetensors").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="give the checkpoint folder"):
        resolve_source(str(tmp_path / "file.safetensors"))
