"""Train a debug model for a few steps, single-process or sharded under torchrun, and write
the per-step losses (averaged over data shards) and this rank's parameter bytes as JSON.

    python tests/parallel/train_worker.py --family llama3 --out losses.json
    torchrun --nproc-per-node 4 tests/parallel/train_worker.py --family llama3 --fsdp 4 --out losses.json
    torchrun --nproc-per-node 2 tests/parallel/train_worker.py --pp 2 --pp-microbatches 2 --out losses.json

A step runs ``--pp-microbatches`` micro-batches (``--global-batch`` split between them and the data ranks);
one process given the same number trains on the same micro-batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import os
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from titanpod.checkpoint import trainer_state_dict
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
from titanpod.parallel import ParallelConfig
from titanpod.parallel.torch_executor import parallelize, parallelize_pipeline, unshard
from titanpod.parallel.torch_executor.pipeline_gather import gather_pipeline_weights
from titanpod.recipes.families import build_model, get_flavor, sharding_plan
from titanpod.runs.process_exit import exit_rank


def local_parameter_bytes(model: torch.nn.Module) -> int:
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="llama3")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    for axis in ("dp-replicate", "fsdp", "ep", "tp", "cp", "pp"):
        parser.add_argument(f"--{axis}", type=int, default=1)
    parser.add_argument("--pp-schedule", default="1f1b")
    parser.add_argument("--pp-microbatches", type=int, default=1, help="micro-batches a step (with or without pp)")
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
    parser.add_argument("--n-layers", type=int, help="the debug flavor with this many layers")
    parser.add_argument("--params-out", type=Path, help="also write the final parameters (safetensors)")
    parser.add_argument("--stop-at", type=int, default=0, help="train.stop_at_step: end after this step")
    parser.add_argument("--save-dir", type=Path, help="save the trainer state (DCP) and data position at the end")
    parser.add_argument("--resume-dir", type=Path, help="load the trainer state and data position saved there first")
    parser.add_argument("--loaded-params-out", type=Path, help="write the parameters as loaded from --resume-dir")
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
    flavor = get_flavor(args.family, "debug")
    if args.n_layers is not None:
        flavor = dataclasses.replace(flavor, n_layers=args.n_layers)
    model = build_model(args.family, flavor, model_ops(kernels), device="cpu")
    model.init_weights(0)
    full_bytes = local_parameter_bytes(model)
    tokenizer = load_tokenizer(builtin_tokenizer_path())
    documents = builtin_corpus_path().read_text(encoding="utf-8").split("\n\n")[:300]
    separator = end_of_text_id(tokenizer)
    tokens = pack_documents(documents, tokenizer, separator)
    document_ends = (tokens == separator).nonzero().flatten() if args.documents else None
    pipeline = None
    if "WORLD_SIZE" in os.environ:
        config = ParallelConfig(
            dp_replicate=args.dp_replicate,
            fsdp=args.fsdp,
            ep=args.ep,
            tp=args.tp,
            cp=args.cp,
            pp=args.pp,
            pp_schedule=args.pp_schedule,
            pp_microbatches=args.pp_microbatches,
            sequence_parallel=not args.no_sequence_parallel,
            fsdp_bucket_mb=args.fsdp_bucket_mb,
            fsdp_prefetch=args.fsdp_prefetch,
        )
        if args.pp > 1:
            pipeline = parallelize_pipeline(model, sharding_plan(args.family), config, backend, args.pp_microbatches)
            sharded = pipeline.sharded
            model = pipeline.model  # this rank's stages: what it trains and saves
        else:
            sharded = parallelize(model, sharding_plan(args.family), config, backend)
        data_rank, data_world, reduce_loss = sharded.data_rank, sharded.data_world, sharded.mean_over_data
    else:
        data_rank, data_world, reduce_loss = 0, 1, None
    batch_size = args.global_batch // data_world // args.pp_microbatches
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
        grad_accum_steps=args.pp_microbatches,
        stop_at_step=args.stop_at,
    )
    step = build_step(model, config, backend, pipeline=pipeline)
    rank = dist.get_rank() if dist.is_initialized() else 0

    def whole_params() -> dict[str, torch.Tensor] | None:
        """The whole model's parameters on rank 0 (None elsewhere); unshards the model when sharded without pp."""
        if pipeline is not None:
            return gather_pipeline_weights(pipeline)
        if dist.is_initialized():
            unshard(model)
        return {name: p.detach().contiguous() for name, p in model.named_parameters()} if rank == 0 else None

    start_step = 0
    if args.resume_dir is not None:
        state = trainer_state_dict(model, step)
        dcp.load(state, checkpoint_id=str(args.resume_dir / "state"))
        step.load_state_dict(state["optim"])
        position = json.loads((args.resume_dir / "position.json").read_text())
        batches.load_state_dict(position["data"])
        start_step = position["step"]
        if args.loaded_params_out is not None:
            loaded = whole_params()
            if loaded is not None:
                save_file(loaded, str(args.loaded_params_out))
    summary = train(
        model,
        batches,
        config,
        backend,
        flops_per_token=1.0,
        data_parallel=data_world,
        reduce_loss=reduce_loss,
        step=step,
        start_step=start_step,
    )
    if args.save_dir is not None:
        dcp.save(trainer_state_dict(model, step), checkpoint_id=str(args.save_dir / "state"))
        if rank == 0:
            position = {"step": summary.steps_done, "data": batches.state_dict()}
            (args.save_dir / "position.json").write_text(json.dumps(position))
    param_bytes = local_parameter_bytes(model)
    collectives = Counter(
        str(node.target).split(".")[1]
        for node in (step.graph.graph.nodes if isinstance(step, WholeStep) and step.graph is not None else ())
        if str(node.target).startswith("_c10d_functional.")
    )
    if args.params_out is not None:
        final = whole_params()
        if final is not None:
            save_file(final, str(args.params_out))
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
    faulthandler.enable()  # an abort during the work prints every thread's stack
    main()
    exit_rank(0)  # as the CLIs' ranks leave: see titanpod.runs.process_exit.exit_rank
