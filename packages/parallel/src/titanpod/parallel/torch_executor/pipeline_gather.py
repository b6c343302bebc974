"""The whole model's weights gathered from every pipeline stage onto one rank (to write a single-file export)."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titanpod.parallel.torch_executor.pipeline import PipelineModel


def _model_order(name: str) -> tuple[int, int, str]:
    """Sort key putting names in the whole model's order: embedding, layers by index, norm, head."""
    layer = re.match(r"layers\.(\d+)\.", name)
    if layer:
        return (1, int(layer.group(1)), name)
    return (0 if name.startswith("tok_embeddings.") else 2, 0, name)


def gather_pipeline_weights(pipeline: PipelineModel) -> dict[str, torch.Tensor] | None:
    """Every parameter of the whole model, whole and on the CPU, in the model's order, on pp rank 0; ``None``
    on the other pp ranks.

    A collective: every rank of the job calls it. Each stage's shards are gathered whole over its
    sub-mesh first, then pp rank 0 of each sub-mesh position receives the other stages' tensors (through
    host memory: it holds the whole model once).
    """
    own = {
        name: (param.full_tensor() if isinstance(param, DTensor) else param).detach().cpu()
        for name, param in pipeline.model.named_parameters()
    }
    parts: list[dict[str, torch.Tensor] | None] | None = [None] * pipeline.layout.pp if pipeline.pp_rank == 0 else None
    dist.gather_object(own, parts, group=pipeline.pp_group, group_dst=0)
    if parts is None:
        return None
    merged = {name: tensor for part in parts if part is not None for name, tensor in part.items()}
    return {name: merged[name] for name in sorted(merged, key=_model_order)}
