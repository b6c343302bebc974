"""Load Hugging Face checkpoints into a model sharded by FSDP, run it, and save it back sharded.

    torchrun --nproc-per-node 2 tests/checkpoint/sharded_weights_worker.py \
        --checkpoint llama3=DIR --checkpoint qwen3=DIR --ids ids.safetensors --out OUT

For each checkpoint, each rank reads only its slices (``PretrainedFolder.reader`` + ``read_into_model``), the
sharded model runs ``ids``, and both of its folders are written sharded: OUT/<family>/logits.safetensors
(rank 0), OUT/<family>/model (``save_model``), OUT/<family>/hf (``save_hf_checkpoint``, 60KB shards) and
OUT/<family>/rank<k>.json (the bytes rank k read and the bytes of parameters it holds).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor

from titanpod.checkpoint import save_hf_checkpoint, save_model
from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.checkpoint.region_reader import read_into_model
from titanpod.device import ensure_process_group, get_backend
from titanpod.models import build_model
from titanpod.parallel import PLANS, ParallelConfig
from titanpod.parallel.torch_executor import parallelize

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
    args = parser.parse_args()
    backend = get_backend("cpu")
    rank = ensure_process_group(backend).rank
    ids = load_file(str(args.ids))["ids"]
    for spec in args.checkpoint:
        family, folder = spec.split("=", 1)
        out = args.out / family
        out.mkdir(parents=True, exist_ok=True)
        pretrained = open_pretrained(folder)
        model = build_model(pretrained.family, pretrained.args)
        model.to_empty(device="cpu")
        parallelize(model, PLANS[family], ParallelConfig(fsdp=2), backend)
        reader = pretrained.reader(model)
        read_into_model(model, reader)
        with torch.no_grad():
            logits = model(ids)
        save_model(model, family, out / "model", METADATA, extra_files=EXTRA_FILES)
        save_hf_checkpoint(model, family, out / "hf", max_shard_size=HF_SHARD_SIZE)
        (out / f"rank{rank}.json").write_text(json.dumps({"read": reader.bytes_read, "held": held_bytes(model)}))
        if rank == 0:
            save_file({"logits": logits.contiguous()}, str(out / "logits.safetensors"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
