"""Create debug models sharded straight from the meta device under torchrun, one layout after another,
gather each parameter whole and compare it, bit for bit, with one process's ``init_weights`` of the
same seed; rank 0 writes what it found as JSON.

    torchrun --nproc-per-node 4 tests/parallel/sharded_init_worker.py --out result.json
"""

from __future__ import annotations

import argparse
import faulthandler
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titanpod.device import ensure_process_group, get_backend
from titanpod.models import region_initializer
from titanpod.parallel import ParallelConfig
from titanpod.parallel.torch_executor import parallelize
from titanpod.recipes.families import build_model, sharding_plan
from titanpod.runs.process_exit import exit_rank

SEED = 7

LAYOUTS = {
    "fsdp4": ("llama3", ParallelConfig(fsdp=4)),
    "fsdp2_tp2": ("llama3", ParallelConfig(fsdp=2, tp=2)),
    "ep2_fsdp2": ("qwen3_moe", ParallelConfig(fsdp=2, ep=2)),
}


def check_layout(family: str, config: ParallelConfig) -> dict:
    """Shard a meta model of ``family`` by ``config``; the names of parameters that differ from one process's
    init, and this rank's local element count against the plan's."""
    backend = get_backend("cpu")
    reference = build_model(family, "debug", device="cpu")
    reference.init_weights(SEED)
    model = build_model(family, "debug")  # on the meta device
    expected_local = sum(
        sharding_plan(family).local_numel(name, tuple(p.shape), config.mesh_axes(dist.get_world_size()))
        for name, p in model.named_parameters()
    )
    sharded = parallelize(model, sharding_plan(family), config, backend, initial_values=region_initializer(model, SEED))
    mismatched, local, devices = [], 0, set()
    for (name, param), want in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert isinstance(param, DTensor), name
        local += param.to_local().numel()
        devices.add(str(param.to_local().device))
        if not torch.equal(param.full_tensor(), want):
            mismatched.append(name)
    return {
        "mismatched": mismatched,
        "local_numel": local,
        "expected_local_numel": expected_local,
        "devices": sorted(devices),
        "axes": sharded.axes,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ensure_process_group(get_backend("cpu"))
    results = {name: check_layout(family, config) for name, (family, config) in LAYOUTS.items()}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    faulthandler.enable()  # an abort during the work prints every thread's stack
    main()
    exit_rank(0)  # as the CLIs' ranks leave: see titanpod.runs.process_exit.exit_rank
