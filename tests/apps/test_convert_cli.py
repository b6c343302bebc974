"""titanpod-convert end to end: Hugging Face in, titanpod checkpoint, Hugging Face out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from tests.hf_models import hf_model, save_sharded
from titanpod.checkpoint import load_model
from titanpod.pretrain.cli import main as pretrain_main
from titanpod.pretrain.convert import main as convert_main

HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def convert(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "titanpod.pretrain.convert", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=300,
        check=False,
    )


def logits_of(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder).eval()(ids).logits


def fake_hub_cache(root: Path, repo_id: str, checkpoint: Path) -> None:
    """Lay ``checkpoint`` out as huggingface_hub's cache holds a downloaded repository."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(checkpoint, repo / "snapshots" / HUB_COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HUB_COMMIT)


def test_import_from_offline_hub_cache_then_export_matches_transformers(tmp_path):
    source = save_sharded(hf_model("qwen3_moe"), tmp_path / "source")
    cache = tmp_path / "hub-cache"
    fake_hub_cache(cache, "acme/tiny-moe", source)
    offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}

    imported = convert("import", "acme/tiny-moe", tmp_path / "ours", env=offline)
    assert imported.returncode == 0, imported.stderr
    assert "imported qwen3_moe" in imported.stdout and "read model-00001-of-" in imported.stdout
    family, model = load_model(tmp_path / "ours")
    assert family == "qwen3_moe" and model.args.moe is not None and model.args.moe.n_experts == 8

    assert convert_main(["export", str(tmp_path / "ours"), str(tmp_path / "back"), "--max-shard-size", "80KB"]) == 0
    ids = torch.randint(0, 2048, (2, 16))
    assert (logits_of(tmp_path / "back", ids) - logits_of(source, ids)).abs().max().item() <= 1e-4

    missing = convert("import", "acme/not-cached", tmp_path / "nothing", env=offline)
    assert missing.returncode == 1
    assert "not in the local Hugging Face cache" in missing.stderr
    assert not (tmp_path / "nothing").exists()


def test_pretrain_checkpoint_exports_to_transformers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    short_run = ["--train.steps", "2", "--train.warmup-steps", "1", "--data.seq-len", "16", "--data.batch-size", "2"]
    assert pretrain_main([*short_run, "--output.run-name", "r"]) == 0
    checkpoint = tmp_path / "runs" / "r" / "model"
    assert convert_main(["export", str(checkpoint), str(tmp_path / "hf"), "--dtype", "bfloat16"]) == 0
    _, ours = load_model(checkpoint)
    ids = torch.randint(0, 2048, (1, 12))
    with torch.no_grad():
        expected = ours.to(torch.bfloat16)(ids).float()
    assert (logits_of(tmp_path / "hf", ids).float() - expected).abs().max().item() <= 1e-2


def test_export_of_a_folder_that_is_not_a_checkpoint_fails_clearly(tmp_path, capsys):
    assert convert_main(["export", str(tmp_path), str(tmp_path / "out")]) == 1
    assert "not a titanpod model checkpoint" in capsys.readouterr().err
