"""Weights in and out of a model sharded by FSDP over two gloo processes, against transformers and one process.

Each rank reads only the slices of the stored tensors it holds; the loaded model's logits equal
transformers' (fp32, within 1e-5); and its saved model/ and Hugging Face folders, gathered one tensor at
a time and written by rank 0, are byte for byte those one process writes from the same weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.checkpoint.sharded_weights_worker import EXTRA_FILES, HF_SHARD_SIZE, METADATA
from tests.parallel.test_torchrun import free_port
from titanpod.checkpoint import load_hf_checkpoint, save_hf_checkpoint, save_model
from titanpod.checkpoint.hf_files import iter_hf_tensors

WORKER = Path(__file__).with_name("sharded_weights_worker.py")
FAMILIES = ("llama3", "qwen3")  # qwen3's tiny checkpoint ties its embeddings


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.mark.slow
def test_fsdp2_loads_only_its_slices_matches_transformers_and_saves_the_same_bytes(
    hf_checkpoints, real_token_ids, tmp_path
):
    from transformers import AutoModelForCausalLM

    save_file({"ids": real_token_ids}, str(tmp_path / "ids.safetensors"))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(WORKER), "--ids", str(tmp_path / "ids.safetensors"),
        "--out", str(tmp_path / "sharded"), *(f"--checkpoint={f}={hf_checkpoints[f]}" for f in FAMILIES),
    ]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    for family in FAMILIES:
        folder, sharded = hf_checkpoints[family], tmp_path / "sharded" / family
        with torch.no_grad():
            expected = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(real_token_ids).logits
        logits = load_file(str(sharded / "logits.safetensors"))["logits"]
        assert (logits - expected).abs().max().item() <= 1e-5, family

        stored = sum(t.numel() * t.element_size() for _, t in iter_hf_tensors(folder))
        for rank in (0, 1):
            counts = json.loads((sharded / f"rank{rank}.json").read_text())
            assert counts["read"] == counts["held"], (family, rank)  # read exactly what it holds
            assert counts["same"], (family, rank)  # created from the files or filled after: the same shards
            assert counts["read"] < 0.55 * stored, (family, rank)  # about half: no rank reads the whole model

        whole = load_hf_checkpoint(folder, dtype=torch.float32).model  # one process, the same weights
        one = tmp_path / "one" / family
        save_model(whole, family, one / "model", METADATA, extra_files=EXTRA_FILES)
        save_hf_checkpoint(whole, family, one / "hf", max_shard_size=HF_SHARD_SIZE)
        for name in ("model", "hf"):
            ours, theirs = files_of(sharded / name), files_of(one / name)
            assert list(ours) == list(theirs), (family, name)
            assert len(ours) > (2 if name == "model" else 3), (family, name)  # weights, index and several shards
            for file, data in theirs.items():
                assert ours[file] == data, (family, name, file)
