"""Train a debug model for a few steps, single-process or sharded under torchrun, and write
the per-step losses (averaged over data shards) and this rank's parameter bytes as JSON.

    python tests/parallel/train_worker.py --family llama3 --out losses.json
    torchrun --nproc-per-node 4 tests/parallel/train_worker.py --family llama3 --fsdp 4 --out losses.json
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from titanpod.data import (
    PackedBatches,
    builtin_corpus_path,
    builtin_tokenizer_path,
    load_tokenizer,
    pack_documents,
)
from titanpod.data.tokenizer import end_of_text_id
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, WholeStep, build_step, train
from titanpod.kernels import KernelConfig, PallasLossConfig, SplashConfig, model_ops
from titanpod.models import build_model
from titanpod.parallel import PLANS, ParallelConfig
from titanpod.parallel.torch_executor import parallelize, unshard


def local_parameter_bytes(model: torch.nn.Module) -> int:
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="llama3")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    for axis in ("dp-replicate", "fsdp", "ep", "tp", "cp"):
        parser.add_argument(f"--{axis}", type=int, default=1)
    parser.add_argument("--no-sequence-parallel", action="store_true")
    parser.add_argument("--documents", action="store_true", help="batches carry document ids (document masking)")
    parser.add_argument(
        "--fsdp-bucket-mb", type=float, default=0.0, help="ParallelConfig.fsdp_bucket_mb (0 here: per parameter)"
    )
    parser.add_argument("--fsdp-prefetch", action="store_true", help="ParallelConfig.fsdp_prefetch")
    parser.add_argument("--step-mode", default="eager")
    parser.add_argument("--memory-policy", default="save")
    parser.add_argument("--compiler", default="none")
    parser.add_argument("--attention", default="sdpa", help="kernels.attention: sdpa or splash (tiles of 128)")
    parser.add_argument("--head-loss", default="reference", help="kernels.head_loss: reference, chunked or pallas")
    parser.add_argument("--params-out", type=Path, help="also write the final parameters (safetensors)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    torch.manual_seed(0)
    backend = get_backend("cpu")
    kernels = KernelConfig(
        attention=args.attention,
        head_loss=args.head_loss,
        splash=SplashConfig(block_q=128, block_kv=128),
        pallas_loss=PallasLossConfig(block_rows=128, block_vocab=512),
    )
    model = build_model(args.family, "debug", model_ops(kernels), device="cpu")
    model.init_weights(0)
    full_bytes = local_parameter_bytes(model)
    tokenizer = load_tokenizer(builtin_tokenizer_path())
    documents = builtin_corpus_path().read_text(encoding="utf-8").split("\n\n")[:300]
    separator = end_of_text_id(tokenizer)
    tokens = pack_documents(documents, tokenizer, separator)
    document_ends = (tokens == separator).nonzero().flatten() if args.documents else None
    if "WORLD_SIZE" in os.environ:
        config = ParallelConfig(
            dp_replicate=args.dp_replicate,
            fsdp=args.fsdp,
            ep=args.ep,
            tp=args.tp,
            cp=args.cp,
            sequence_parallel=not args.no_sequence_parallel,
            fsdp_bucket_mb=args.fsdp_bucket_mb,
            fsdp_prefetch=args.fsdp_prefetch,
        )
        sharded = parallelize(model, PLANS[args.family], config, backend)
        data_rank, data_world, reduce_loss = sharded.data_rank, sharded.data_world, sharded.mean_over_data
    else:
        data_rank, data_world, reduce_loss = 0, 1, None
    batch_size = args.global_batch // data_world
    batches = PackedBatches(tokens, args.seq_len, batch_size, 0, data_rank, data_world, document_ends)
    config = TrainConfig(
        steps=args.steps,
        lr=1e-3,  # at 3e-3 a loss spike in the MoE run magnified rounding to 1.8e-5 relative
        warmup_steps=2,
        log_every=args.steps,
        grad_clip=1.0,
        step_mode=args.step_mode,
        memory_policy=args.memory_policy,
        compiler=args.compiler,
    )
    step = build_step(model, config, backend)
    summary = train(
        model,
        batches,
        config,
        backend,
        flops_per_token=1.0,
        data_parallel=data_world,
        reduce_loss=reduce_loss,
        step=step,
    )
    param_bytes = local_parameter_bytes(model)
    collectives = Counter(
        str(node.target).split(".")[1]
        for node in (step.graph.graph.nodes if isinstance(step, WholeStep) and step.graph is not None else ())
        if str(node.target).startswith("_c10d_functional.")
    )
    rank = dist.get_rank() if dist.is_initialized() else 0
    if args.params_out is not None:
        if dist.is_initialized():
            unshard(model)
        if rank == 0:
            save_file({name: p.detach().contiguous() for name, p in model.named_parameters()}, str(args.params_out))
    if rank == 0:
        result = {
            "losses": summary.losses,
            "param_bytes": param_bytes,
            "full_bytes": full_bytes,
            "graph_collectives": dict(collectives),
        }
        args.out.write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
