"""A run with ``--kernels.window`` and ``--checkpoint.export-hf``: its export states the window, or the run is
refused before any work when its family's Hugging Face class has no sliding window."""

from __future__ import annotations

import json

from tests.apps.test_pretrain_cli import SHORT_RUN, pretrain


def test_a_qwen3_run_with_a_window_exports_it_in_config_json(tmp_path):
    result = pretrain("--recipe", "qwen3_debug", *SHORT_RUN, "--kernels.window", "4", "--checkpoint.export-hf",
                      "--output.run-name", "windowed", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    config = json.loads((tmp_path / "runs" / "windowed" / "hf" / "config.json").read_text())
    assert config["use_sliding_window"] is True and config["sliding_window"] == 5


def test_a_llama_run_with_a_window_and_an_export_is_refused_before_training(tmp_path):
    result = pretrain(*SHORT_RUN, "--kernels.window", "4", "--checkpoint.export-hf", "--output.run-name", "windowed",
                      cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0
    assert "kernels.window 4: transformers' LlamaForCausalLM has no sliding window" in result.stderr
    assert not (tmp_path / "runs" / "windowed" / "metrics.jsonl").exists()
    assert not list(tmp_path.glob("runs/windowed/checkpoints/step-*"))
