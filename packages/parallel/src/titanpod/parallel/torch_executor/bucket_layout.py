"""Where each parameter's shard sits in a bucket, and how a gathered bucket is cut back into whole tensors.

Legend: R ranks the bucket is gathered over, T elements of one rank's shards in the bucket.

One rank's bucket is its shards of the bucket's parameters, each flattened, laid end to end
([T]). Gathering it over R ranks gives [R, T] (rank-major, as ``all_gather_into_tensor``
returns it); a parameter split on dimension d is rank r's shard at chunk r of dimension d, so
its whole tensor is its columns of every row, stood side by side along d. Only ordinary
differentiable ops are used to cut the gathered bucket, so autograd packs the gradients of
the whole tensors back into the [R, T] layout by itself (``split``'s backward is one ``cat``),
ready for one reduce-scatter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BucketEntry:
    """One parameter of a bucket: the shape of one rank's shard and the dimension it was split on."""

    local_shape: tuple[int, ...]
    """Shape of one rank's shard (every rank's is the same: the plan splits evenly)."""
    shard_dim: int
    """The dimension the data-shard axes split (chunk r of it belongs to rank r)."""

    @property
    def numel(self) -> int:
        """Elements of one rank's shard."""
        return math.prod(self.local_shape)

    def whole_shape(self, ranks: int) -> tuple[int, ...]:
        """The parameter's whole shape, gathered from ``ranks`` shards."""
        shape = list(self.local_shape)
        shape[self.shard_dim] *= ranks
        return tuple(shape)


@dataclass(frozen=True)
class BucketLayout:
    """The parameters of one bucket, in order, and how many ranks hold a shard of each."""

    entries: tuple[BucketEntry, ...]
    """The bucket's parameters, in the order their shards are laid out."""
    ranks: int
    """Ranks the bucket is gathered from (the product of the parameter's data-shard axes)."""

    def __post_init__(self) -> None:
        for entry in self.entries:
            if not 0 <= entry.shard_dim < len(entry.local_shape):
                raise ValueError(
                    f"A bucket entry of shape {entry.local_shape} cannot be split on dimension {entry.shard_dim}."
                )

    @property
    def numels(self) -> list[int]:
        """Elements of each parameter's shard, in order."""
        return [entry.numel for entry in self.entries]

    @property
    def shard_numel(self) -> int:
        """T: elements of one rank's part of the bucket."""
        return sum(self.numels)

    def pack_shards(self, shards: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """This rank's shards as one flat [T] tensor of ``dtype`` (the all-gather's input)."""
        if len(shards) != len(self.entries):
            raise ValueError(f"The bucket holds {len(self.entries)} parameters but {len(shards)} shards were given.")
        for shard, entry in zip(shards, self.entries, strict=True):
            if tuple(shard.shape) != entry.local_shape:
                raise ValueError(f"A shard of shape {tuple(shard.shape)} was given where {entry.local_shape} belongs.")
        return torch.cat([shard.reshape(-1).to(dtype) for shard in shards])

    def unpack_gathered(self, gathered: torch.Tensor) -> list[torch.Tensor]:
        """The whole parameters from a gathered bucket ([R x T] flat, rank-major), differentiably."""
        rows_RT = gathered.view(self.ranks, self.shard_numel)
        wholes = []
        for piece, entry in zip(rows_RT.split(self.numels, dim=1), self.entries, strict=True):
            chunks = piece.unflatten(1, entry.local_shape)  # [R, *local]: chunk r is rank r's shard
            wholes.append(chunks.movedim(0, entry.shard_dim).reshape(entry.whole_shape(self.ranks)))
        return wholes

    def unpack_shards(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """This rank's shards (views) from a flat [T] tensor laid out as ``pack_shards`` lays them."""
        pieces = flat.split(self.numels)
        return [piece.view(entry.local_shape) for piece, entry in zip(pieces, self.entries, strict=True)]
