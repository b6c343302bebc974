"""Load Hugging Face checkpoints into a model sharded by FSDP, run it, and save it back sharded.

    torchrun --nproc-per-node 2 tests/checkpoint/sharded_weights_worker.py \
        --checkpoint llama3=DIR --checkpoint qwen3=DIR --ids ids.safetensors --out OUT [--parallel fsdp=2]

For each checkpoint, each rank creates only its shards from the slices it reads (``parallelize`` of a meta
model with ``initial_values=PretrainedFolder.reader``, as the runners do; a model made whole, sharded and then
filled by ``read_into_model`` must hold the same shards), the sharded model runs ``ids``, and both of its
folders are written sharded: OUT/<family>/logits.safetensors (rank 0), OUT/<family>/model (``save_model``),
OUT/<family>/hf (``save_hf_checkpoint``, 60KB shards) and OUT/<family>/rank<k>.json (the bytes rank k read,
the bytes of parameters it holds, and whether both ways gave the same shards).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor

from titanpod.checkpoint import safetensors_stream, save_hf_checkpoint, save_model
from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.checkpoint.region_reader import read_into_model
from titanpod.device import ensure_process_group, get_backend
from titanpod.parallel import ParallelConfig
from titanpod.parallel.torch_executor import parallelize
from titanpod.recipes.families import build_model, decoder_adapters, hf_adapter, sharding_plan
from titanpod.runs.process_exit import exit_rank

METADATA = {"step": 0}
EXTRA_FILES = {"recipe.json": "{}\n"}
HF_SHARD_SIZE = "60KB"


def held_bytes(model: torch.nn.Module) -> int:
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", action="append", required=True, help="family=folder")
    parser.add_argument("--ids", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parallel", default="fsdp=2", help="ParallelConfig degrees, e.g. dp_replicate=2,tp=2")
    args = parser.parse_args()
    config = ParallelConfig(
        **{key: int(value) for key, value in (part.split("=") for part in args.parallel.split(","))}
    )
    safetensors_stream.BLOCK_BYTES = 4096  # tensors travel in many row blocks, as a large model's do
    backend = get_backend("cpu")
    rank = ensure_process_group(backend).rank
    ids = load_file(str(args.ids))["ids"]
    for spec in args.checkpoint:
        family, folder = spec.split("=", 1)
        out = args.out / family
        out.mkdir(parents=True, exist_ok=True)
        pretrained = open_pretrained(folder, decoder_adapters())
        model = build_model(pretrained.family, pretrained.args)  # on the meta device: created shard by shard
        reader = pretrained.reader(model)
        parallelize(model, sharding_plan(family), config, backend, initial_values=reader)
        filled = build_model(pretrained.family, pretrained.args, device="cpu")  # made whole, sharded, then filled
        parallelize(filled, sharding_plan(family), config, backend)
        read_into_model(filled, pretrained.reader(filled))
        same = all(
            torch.equal(a.to_local(), b.to_local())
            for a, b in zip(model.parameters(), filled.parameters(), strict=True)
        )
        with torch.no_grad():
            logits = model(ids)
        save_model(model, family, out / "model", METADATA, extra_files=EXTRA_FILES)
        save_hf_checkpoint(model, hf_adapter(family), out / "hf", max_shard_size=HF_SHARD_SIZE)
        (out / f"rank{rank}.json").write_text(
            json.dumps({"read": reader.bytes_read, "held": held_bytes(model), "same": same})
        )
        if rank == 0:
            save_file({"logits": logits.contiguous()}, str(out / "logits.safetensors"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    faulthandler.enable()  # an abort during the work prints every thread's stack
    main()
    exit_rank(0)  # as the CLIs' ranks leave: see titanpod.runs.process_exit.exit_rank
