"""What a pretraining run does differently with pipeline stages (``parallel.pp`` > 1)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titanpod.checkpoint.safetensors_stream import TensorEntry
from titanpod.models import Transformer
from titanpod.parallel.torch_executor import PipelineModel
from titanpod.parallel.torch_executor.pipeline_gather import gather_pipeline_weights
from titanpod.recipes.families import build_model
from titanpod.recipes.pipeline_batch import with_pipeline_microbatches as with_pipeline_microbatches


def whole_model_on_writer(pipeline: PipelineModel, family: str, built: Transformer) -> Transformer | None:
    """The whole trained model on global rank 0, its weights gathered from every stage (on the host), for the
    final export; ``None`` on every other rank. ``built``: the whole model as built (on the meta device), whose
    arguments and kernels the copy takes. A collective: every rank calls it."""
    weights = gather_pipeline_weights(pipeline)
    if weights is None or dist.get_rank() != 0:
        return None
    model = build_model(family, built.args, built.ops)
    model.load_state_dict(weights, strict=True, assign=True)
    return model


class PipelineTensors:
    """The whole model's parameters for the final export, each fetched in turn from the pp rank holding it.

    The stage's ranks gather the tensor whole over their sub-mesh, the first of them sends it to global rank 0,
    which writes it before the next is fetched: the writer holds one tensor at a time, never the model.
    Every rank must fetch every name, in the order of ``entries`` (``titanpod.checkpoint``'s ``TensorSource``).
    """

    def __init__(self, pipeline: PipelineModel, whole: Transformer) -> None:
        """``whole``: the model as built (on the meta device), for the names, order, shapes and dtypes."""
        self.pipeline = pipeline
        self.entries = [TensorEntry(name, tuple(p.shape), p.dtype) for name, p in whole.named_parameters()]
        """Every parameter of the whole model, in its order."""
        self._entries = {entry.name: entry for entry in self.entries}
        held = list(dict(pipeline.model.named_parameters()))
        every: list[list[str] | None] = [None] * pipeline.layout.pp
        dist.all_gather_object(every, held, group=pipeline.pp_group)
        self._owner = {name: rank for rank, names in enumerate(every) for name in names or []}
        mesh = pipeline.mesh.mesh  # global ranks, [pp, *sub-mesh]
        self._sender = {rank: int(mesh[rank].flatten()[0]) for rank in range(pipeline.layout.pp)}
        self._own = dict(pipeline.model.named_parameters())

    def fetch(self, name: str) -> torch.Tensor | None:
        """Parameter ``name`` whole on global rank 0 (on the CPU), ``None`` elsewhere; a collective."""
        owner = self._owner[name]
        me = dist.get_rank()
        whole = None
        if owner == self.pipeline.pp_rank:
            param = self._own[name]
            whole = (param.full_tensor() if isinstance(param, DTensor) else param).detach().contiguous()
        sender = self._sender[owner]
        if sender == 0:
            return whole.cpu() if me == 0 and whole is not None else None
        if me == sender:
            assert whole is not None
            dist.send(whole, dst=0)
        elif me == 0:
            entry = self._entries[name]
            received = torch.empty(entry.shape, dtype=entry.dtype, device=self._device())
            dist.recv(received, src=sender)
            return received.cpu()
        return None

    def _device(self) -> torch.device:
        param = next(iter(self._own.values()))
        return (param.to_local() if isinstance(param, DTensor) else param).device
