"""Weights in and out of a sharded model on gloo processes, against transformers and one process.

Each rank reads only the slices of the stored tensors it holds; the loaded model's logits equal
transformers' (fp32, within 1e-5); and its saved model/ and Hugging Face folders, gathered one tensor at
a time on rank 0 and written there, are byte for byte those one process writes from the same weights.
FSDP=2 over two processes (Llama 3 and Qwen 3), and replicas x tensor parallelism (2 x 2) over four.
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
from titanpod.recipes.families import decoder_adapters, hf_adapter

WORKER = Path(__file__).with_name("sharded_weights_worker.py")


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


CASES = {  # parallel degrees -> processes, families, most of the stored bytes one rank may read
    "fsdp=2": (2, ("llama3", "qwen3"), 0.55),  # qwen3's tiny checkpoint ties its embeddings
    "dp_replicate=2,tp=2": (4, ("llama3",), 0.95),  # replicas hold the same regions; the embedding and head are whole
}


@pytest.mark.slow
@pytest.mark.parametrize("parallel", sorted(CASES))
def test_sharded_ranks_read_only_their_slices_match_transformers_and_save_the_same_bytes(
    parallel, hf_checkpoints, real_token_ids, tmp_path
):
    from transformers import AutoModelForCausalLM

    processes, families, most = CASES[parallel]
    save_file({"ids": real_token_ids}, str(tmp_path / "ids.safetensors"))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), "--master-addr",
        "127.0.0.1", "--master-port", str(free_port()), str(WORKER), "--ids", str(tmp_path / "ids.safetensors"),
        "--out", str(tmp_path / "sharded"), "--parallel", parallel,
        *(f"--checkpoint={f}={hf_checkpoints[f]}" for f in families),
    ]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-8000:]
    for family in families:
        folder, sharded = hf_checkpoints[family], tmp_path / "sharded" / family
        with torch.no_grad():
            expected = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(real_token_ids).logits
        logits = load_file(str(sharded / "logits.safetensors"))["logits"]
        assert (logits - expected).abs().max().item() <= 1e-5, family

        stored = sum(t.numel() * t.element_size() for _, t in iter_hf_tensors(folder))
        for rank in range(processes):
            counts = json.loads((sharded / f"rank{rank}.json").read_text())
            assert counts["read"] == counts["held"], (family, rank)  # read exactly what it holds
            assert counts["same"], (family, rank)  # created from the files or filled after: the same shards
            assert counts["read"] < most * stored, (family, rank)  # no rank reads the whole model

        whole = load_hf_checkpoint(
            folder, dtype=torch.float32, adapters=decoder_adapters()
        ).model  # one process, the same weights
        one = tmp_path / "one" / family
        save_model(whole, family, one / "model", METADATA, extra_files=EXTRA_FILES)
        save_hf_checkpoint(whole, hf_adapter(family), one / "hf", max_shard_size=HF_SHARD_SIZE)
        for name in ("model", "hf"):
            ours, theirs = files_of(sharded / name), files_of(one / name)
            assert list(ours) == list(theirs), (family, name)
            assert len(ours) > (2 if name == "model" else 3), (family, name)  # weights, index and several shards
            for file, data in theirs.items():
                assert ours[file] == data, (family, name, file)
