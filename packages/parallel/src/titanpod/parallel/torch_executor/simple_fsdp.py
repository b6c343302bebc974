"""SimpleFSDP: parameters stored as sharded DTensors and gathered where the model reads them.

The gather is a DTensor redistribution (all-gather) inside the forward, and its backward
is the reduce-scatter of the gradient, so both are ordinary ops that ``make_fx`` and
``torch.compile`` can see, bucket and reorder. State-dict names do not change: each
module's class gains a property per parameter that returns the gathered tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor

from titanpod.parallel.plan import ParamRule
from titanpod.parallel.torch_executor.collectives import scale_grad


@dataclass(frozen=True)
class ParamLayout:
    """The three placements of one parameter on the mesh (one entry per mesh axis)."""

    stored: tuple[Placement, ...]
    """How the parameter (and its gradient and optimizer state) lives between steps."""
    compute: tuple[Placement, ...]
    """What the model computes with: whole over the data axes, split where tp/ep split it."""
    grad: tuple[Placement, ...]
    """How the computed gradient relates across ranks before it is reduced into ``stored``."""
    grad_scale: float
    """Extra factor on the gradient (experts: their tokens came from every ep rank)."""
    blockwise: tuple[int, int, int] | None = None
    """For a fused tp dimension (``ParamRule.tp_blocks``): (tensor dimension, blocks, index of ``tp`` among the
    mesh dimensions). Stored split over tp like any other, it is gathered whole over tp too and each rank
    keeps its share of every block; the gradient, nonzero only on those shares, is summed back over tp."""


def layout_for(
    rule: ParamRule, axes: dict[str, int], mesh_axes: tuple[str, ...], sequence_parallel: bool = False
) -> ParamLayout:
    """The placements a plan rule gives a parameter on a mesh whose dimensions are ``mesh_axes``."""
    expert = rule.ep_dim is not None
    partial_over_tp = rule.tp_dim is None and (
        rule.tp_grad == "sum" or (rule.tp_grad == "sum_if_sequence_parallel" and sequence_parallel)
    )
    stored, compute, grad = [], [], []
    blockwise = None
    for index, axis in enumerate(mesh_axes):
        if axis == "tp" and rule.tp_dim is not None and rule.tp_blocks > 1:
            stored.append(Shard(rule.tp_dim))
            compute.append(Replicate())
            grad.append(Partial("sum"))
            blockwise = (rule.tp_dim, rule.tp_blocks, index)
        elif axis == "tp":
            split = Shard(rule.tp_dim) if rule.tp_dim is not None else Replicate()
            stored.append(split)
            compute.append(split)
            grad.append(Partial("sum") if partial_over_tp else split)
        elif axis == "ep" and expert:
            stored.append(Shard(rule.ep_dim))  # type: ignore[arg-type]
            compute.append(Shard(rule.ep_dim))  # type: ignore[arg-type]
            grad.append(Shard(rule.ep_dim))  # type: ignore[arg-type]
        else:  # a data axis: stored sharded (not over dp_replicate), computed whole, gradient averaged
            whole = axis == "dp_replicate" or rule.shard_dim is None
            stored.append(Replicate() if whole else Shard(rule.shard_dim))  # type: ignore[arg-type]
            compute.append(Replicate())
            grad.append(Partial("avg"))
    grad_scale = 1.0 / axes.get("ep", 1) if expert else 1.0
    return ParamLayout(tuple(stored), tuple(compute), tuple(grad), grad_scale, blockwise)


def make_gather(
    layout: ParamLayout, param_dtype: torch.dtype, reduce_dtype: torch.dtype
) -> Callable[[DTensor], torch.Tensor]:
    """The function that turns a stored DTensor parameter into the local tensor the model computes with."""

    def gather(stored: DTensor) -> torch.Tensor:
        whole = stored.redistribute(placements=layout.compute, forward_dtype=param_dtype, backward_dtype=reduce_dtype)
        local = whole.to_local(grad_placements=layout.grad)
        if layout.blockwise is not None:
            dim, blocks, tp_index = layout.blockwise
            ways, rank = stored.device_mesh.size(tp_index), stored.device_mesh.get_local_rank(tp_index)
            local = local.unflatten(dim, (blocks, ways, -1)).select(dim + 1, rank).flatten(dim, dim + 1)
        return local if layout.grad_scale == 1.0 else scale_grad(local, layout.grad_scale)

    return gather


def _gathering_class(cls: type[nn.Module], names: tuple[str, ...]) -> type[nn.Module]:
    def reader(name: str) -> property:
        return property(lambda self: self._titanpod_gather[name](self._parameters[name]))

    return type(f"Sharded{cls.__name__}", (cls,), {name: reader(name) for name in names})


def shard_module_params(
    module: nn.Module,
    layouts: dict[str, ParamLayout],
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    create: Callable[[str, torch.Tensor, tuple[Placement, ...]], nn.Parameter] | None = None,
) -> None:
    """Replace ``module``'s own parameters by sharded DTensors and make reads of them gather.

    A parameter on the meta device is made by ``create(name, meta_param, stored_placements)`` (each rank
    creating only its own shard, ``titanpod.parallel.torch_executor.materialize``); any other is split.
    """
    names = tuple(layouts)
    for name in names:
        param = module._parameters[name]
        assert param is not None
        if param.is_meta and create is not None:
            module._parameters[name] = create(name, param, layouts[name].stored)
        else:
            module._parameters[name] = nn.Parameter(distribute_tensor(param.data, mesh, layouts[name].stored))
    module._titanpod_gather = {  # type: ignore[assignment]
        name: make_gather(layouts[name], param_dtype, reduce_dtype) for name in names
    }
    module._titanpod_plain_class = type(module)  # type: ignore[assignment]
    module.__class__ = _gathering_class(type(module), names)


def unshard_module_params(module: nn.Module) -> None:
    """Undo ``shard_module_params`` (and any later class swap): whole parameters, the plain class.

    A collective: every rank of the mesh must call it, in the same module order.
    """
    plain = getattr(module, "_titanpod_plain_class", None)
    if plain is None:
        return
    for name in module._titanpod_gather:  # type: ignore[union-attr]
        sharded = module._parameters[name]
        assert isinstance(sharded, DTensor)
        module._parameters[name] = nn.Parameter(sharded.full_tensor())
    del module._titanpod_gather, module._titanpod_plain_class
    module.__class__ = plain
