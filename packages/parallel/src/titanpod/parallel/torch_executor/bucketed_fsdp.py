"""Bucketed (and optionally prefetched) SimpleFSDP gathers: one collective per bucket, not per parameter.

``install_buckets`` runs after ``shard_module_params``. It groups the sharded parameters by
block (each element of a top-level ``nn.ModuleList``/``nn.ModuleDict`` such as ``layers.N``,
and each other top-level module), packs each group into buckets of at most
``fsdp_bucket_mb`` of whole parameters, and hangs a forward pre-hook on the group's module
that gathers its buckets (``bucket_collectives``): the parameter readers that
``simple_fsdp`` installed then return the gathered tensors instead of gathering alone,
until the module's forward ends. A parameter read while its block is not running (e.g. the
output head read by the loss, not by ``output.forward``) is gathered alone, as before.

A parameter goes in a bucket when, on every mesh axis, it is either split on one dimension
(the same for all such axes), gathered whole and its gradient averaged (the data-shard axes:
``fsdp``, ``cp``, ``ep`` for non-experts), or stored whole with its gradient averaged
(``dp_replicate``), or whole with nothing to reduce (``tp`` for parameters tp keeps whole and
whose tp ranks see the same activations). Others (tp-split parameters, experts, parameters
stored whole everywhere, sequence-parallel norms whose gradient sums over tp) keep their own
gather.

With prefetch, a block's pre-hook also starts the next block's gathers (the next element of
the same list), which that block's pre-hook then only waits for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from titanpod.parallel.plan import ShardingPlan
from titanpod.parallel.torch_executor.bucket_collectives import (
    BucketComms,
    ProcessGroupRef,
    drain,
    finish_gather,
    start_gather,
)
from titanpod.parallel.torch_executor.bucket_layout import BucketEntry, BucketLayout
from titanpod.parallel.torch_executor.simple_fsdp import ParamLayout, layout_for

_MB = 1024 * 1024


@dataclass(frozen=True)
class DataSplit:
    """How a bucketable parameter lies over the mesh's data axes."""

    shard_axes: tuple[str, ...]
    """Mesh axes its shard dimension is split over (outermost first)."""
    shard_dim: int
    """The dimension they split."""
    replica_axes: tuple[str, ...]
    """Mesh axes that hold it whole and average its gradient."""


def data_split(layout: ParamLayout, mesh_axes: tuple[str, ...]) -> DataSplit | None:
    """The parameter's data split if its gather and reduction are only over data axes, else None."""
    if layout.grad_scale != 1.0:
        return None
    shard_axes, replica_axes, dims = [], [], set()
    for axis, stored, compute, grad in zip(mesh_axes, layout.stored, layout.compute, layout.grad, strict=True):
        if not isinstance(compute, Replicate):
            return None
        averaged = isinstance(grad, Partial) and grad.reduce_op == "avg"
        if isinstance(stored, Shard) and averaged:
            shard_axes.append(axis)
            dims.add(stored.dim)
        elif isinstance(stored, Replicate) and averaged:
            replica_axes.append(axis)
        elif not (isinstance(stored, Replicate) and isinstance(grad, Replicate)):
            return None
    if not shard_axes or len(dims) != 1:
        return None
    return DataSplit(tuple(shard_axes), dims.pop(), tuple(replica_axes))


@dataclass
class _Slot:
    module: nn.Module
    name: str


@dataclass
class _Bucket:
    comms: BucketComms
    slots: list[_Slot]

    def start(self) -> torch.Tensor:
        shards = []
        for slot in self.slots:
            stored = slot.module._parameters[slot.name]
            assert isinstance(stored, DTensor), f"{slot.name} is not sharded any more"
            shards.append(stored.to_local())
        return start_gather(self.comms, shards)

    def finish(self, pending: torch.Tensor) -> None:
        for slot, whole in zip(self.slots, finish_gather(self.comms, pending), strict=True):
            slot.module._titanpod_live[slot.name] = whole  # type: ignore[index]


@dataclass
class _Prefetches:
    """Gathers started ahead of their block, by block id (at most one block's at a time)."""

    pending: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def take(self, block: int) -> list[torch.Tensor] | None:
        mine = self.pending.pop(block, None)
        for stale in self.pending.values():  # a forward that stopped early: never read them
            for tensor in stale:
                drain(tensor)
        self.pending.clear()
        return mine


@dataclass
class _Group:
    index: int
    path: str
    buckets: list[_Bucket]
    prefetches: _Prefetches
    next: _Group | None = None
    prefetch: bool = False

    def before(self, module: nn.Module, args: Any) -> None:
        pending = self.prefetches.take(self.index)
        if pending is None:
            pending = [bucket.start() for bucket in self.buckets]
        if self.prefetch and self.next is not None:
            self.prefetches.pending[self.next.index] = [bucket.start() for bucket in self.next.buckets]
        for bucket, started in zip(self.buckets, pending, strict=True):
            bucket.finish(started)

    def after(self, module: nn.Module, args: Any, output: Any) -> None:
        for bucket in self.buckets:
            for slot in bucket.slots:
                slot.module._titanpod_live.pop(slot.name, None)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class BucketSummary:
    """What ``install_buckets`` did: for tests, logs and benchmarks."""

    buckets: tuple[tuple[str, int], ...]
    """(block path, parameters in the bucket) for each bucket, in gather order. A bucket is gathered when its
    block's forward runs; parameters read without it (the output head, read by the loss) go alone."""
    alone: tuple[str, ...]
    """Sharded parameters that keep their own gather."""
    prefetch: bool
    """Whether each block starts the next block's gathers."""


def _blocks(model: nn.Module) -> list[list[tuple[str, nn.Module]]]:
    """Top-level blocks as chains: the elements of each top-level list in order, or one other module alone."""
    chains = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList | nn.ModuleDict):
            chains.append([(f"{name}.{key}", block) for key, block in child.named_children()])
        else:
            chains.append([(name, child)])
    return chains


class _LiveOrGather:
    """A parameter reader: the tensor its block's bucket gathered while the block runs, else a gather alone."""

    def __init__(self, module: nn.Module, name: str, alone: Callable[[DTensor], torch.Tensor]) -> None:
        self.module, self.name, self.alone = module, name, alone

    def __call__(self, stored: DTensor) -> torch.Tensor:
        live = self.module._titanpod_live.get(self.name)  # type: ignore[union-attr]
        return live if live is not None else self.alone(stored)


class _Groups:
    """Flattened submeshes, one per set of axes, made once (making one is a collective)."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.mesh, self.made = mesh, {}

    def ref(self, axes: tuple[str, ...]) -> ProcessGroupRef | None:
        if not axes:
            return None
        if axes not in self.made:
            sub = self.mesh[axes[0]] if len(axes) == 1 else self.mesh[axes]._flatten("_".join(axes) + "_buckets")
            self.made[axes] = ProcessGroupRef(sub.get_group().group_name, sub.size())
        return self.made[axes]


@dataclass(frozen=True)
class _Packing:
    """What packing a block's parameters into buckets needs to know about the run."""

    plan: ShardingPlan
    axes: dict[str, int]
    mesh_axes: tuple[str, ...]
    sequence_parallel: bool
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    cap_bytes: float
    groups: _Groups


def _pack_block(path: str, block: nn.Module, packing: _Packing, alone: list[str]) -> list[_Bucket]:
    """The buckets of one block's bucketable parameters (noting the others in ``alone``), and route their reads."""
    open_buckets: dict[tuple, tuple[list[BucketEntry], list[_Slot], int]] = {}
    closed: list[tuple[tuple, list[BucketEntry], list[_Slot]]] = []
    for module_name, module in block.named_modules(prefix=path):
        gather = getattr(module, "_titanpod_gather", None)
        for name in list(gather or ()):
            stored = module._parameters[name]
            rule = packing.plan.rule_for(f"{module_name}.{name}")
            layout = layout_for(rule, packing.axes, packing.mesh_axes, packing.sequence_parallel)
            split = data_split(layout, packing.mesh_axes)
            if not isinstance(stored, DTensor) or split is None:
                alone.append(f"{module_name}.{name}")
                continue
            key = (split.shard_axes, split.replica_axes, stored.dtype)
            whole_bytes = stored.numel() * packing.param_dtype.itemsize
            entries, slots, size = open_buckets.get(key, ([], [], 0))
            if entries and size + whole_bytes > packing.cap_bytes:
                closed.append((key, entries, slots))
                entries, slots, size = [], [], 0
            entries.append(BucketEntry(tuple(stored.to_local().shape), split.shard_dim))
            slots.append(_Slot(module, name))
            open_buckets[key] = (entries, slots, size + whole_bytes)
            module.__dict__.setdefault("_titanpod_live", {})
            gather[name] = _LiveOrGather(module, name, gather[name])  # type: ignore[index]
    closed += [(key, entries, slots) for key, (entries, slots, _) in open_buckets.items()]
    buckets = []
    for (shard_axes, replica_axes, stored_dtype), entries, slots in closed:
        shards = packing.groups.ref(shard_axes)
        assert shards is not None
        replicas = packing.groups.ref(replica_axes)
        layout = BucketLayout(tuple(entries), shards.size)
        comms = BucketComms(layout, shards, replicas, packing.param_dtype, packing.reduce_dtype, stored_dtype)
        buckets.append(_Bucket(comms, slots))
    return buckets


def install_buckets(
    model: nn.Module,
    plan: ShardingPlan,
    axes: dict[str, int],
    mesh: DeviceMesh,
    mesh_axes: tuple[str, ...],
    sequence_parallel: bool,
    dtypes: tuple[torch.dtype, torch.dtype],
    bucket_mb: float,
    prefetch: bool,
) -> BucketSummary:
    """Gather ``model``'s sharded parameters block by block in buckets of at most ``bucket_mb`` (see the module).

    ``dtypes`` is (param_dtype, reduce_dtype). Every rank must call it with the same arguments
    (it may make process groups). ``remove_buckets`` undoes it.
    """
    packing = _Packing(plan, axes, mesh_axes, sequence_parallel, *dtypes, bucket_mb * _MB, _Groups(mesh))
    prefetches = _Prefetches()
    hooks, made, alone = [], [], []
    for chain in _blocks(model):
        previous: _Group | None = None
        for path, block in chain:
            buckets = _pack_block(path, block, packing, alone)
            if not buckets:
                continue
            group = _Group(len(made), path, buckets, prefetches, prefetch=prefetch)
            made.append(group)
            if previous is not None:
                previous.next = group
            previous = group
            hooks.append(block.register_forward_pre_hook(group.before))
            hooks.append(block.register_forward_hook(group.after, always_call=True))
    model._titanpod_bucket_hooks = hooks  # type: ignore[assignment]
    summary = tuple((group.path, len(bucket.slots)) for group in made for bucket in group.buckets)
    return BucketSummary(summary, tuple(alone), prefetch)


def remove_buckets(model: nn.Module) -> None:
    """Undo ``install_buckets``: drop the hooks; every parameter is gathered alone again."""
    for hook in getattr(model, "_titanpod_bucket_hooks", ()):
        hook.remove()
    model.__dict__.pop("_titanpod_bucket_hooks", None)
    for module in model.modules():
        gather = getattr(module, "_titanpod_gather", None)
        if gather is not None:
            for name, reader in gather.items():
                if isinstance(reader, _LiveOrGather):
                    gather[name] = reader.alone
        module.__dict__.pop("_titanpod_live", None)
