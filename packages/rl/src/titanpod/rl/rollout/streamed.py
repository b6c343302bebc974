"""Weights from a trainer, sharded or whole, into a rollout engine in the engine's dtype: streamed one gathered
tensor at a time into a ``BuiltinEngine``, as one whole copy into engines fed from one process (Ray, vLLM)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from titanpod.rl.rollout.builtin import BuiltinEngine
from titanpod.rl.rollout.ray_rollout import RayRollout
from titanpod.rl.rollout.sync import trainer_state
from titanpod.rl.rollout.types import RolloutEngine, SyncReport


def gathered_weights(model: nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s weights one at a time, in sorted name order (plain parameter names), each whole and in ``dtype``.

    A sharded weight is cast to ``dtype`` on this rank's shard first and then gathered (a collective: every
    process must draw the same items in the same order), so the gather moves and makes only ``dtype`` bytes. The
    items are made as they are drawn: a consumer that copies each one and lets it go holds one weight's worth of
    extra memory at a time, never a whole copy of the model. A plain weight already in ``dtype`` comes as the
    model's own tensor (read it, never write to it).
    """
    state = trainer_state(model)
    for name in sorted(state):
        tensor = state[name].to(dtype)
        yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def whole_weights(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """``model``'s weights under plain parameter names, each whole (in ``dtype`` when given): a whole copy, for an
    engine fed from one process (Ray workers, vLLM), where the policy is not sharded."""
    if dtype is None:
        return {
            name: tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            for name, tensor in trainer_state(model).items()
        }
    return dict(gathered_weights(model, dtype))


@torch.no_grad()
def sync_engine(model: nn.Module, engine: RolloutEngine, version: int) -> SyncReport:
    """Copy ``model``'s weights into ``engine`` as ``version``, in the engine's dtype; it verifies them by checksum.

    A ``BuiltinEngine`` takes them streamed (``gathered_weights``): one weight is gathered, copied in and let go
    before the next. Every process calls it (gathering sharded weights is a collective); each syncs its own engine.
    Ray workers get one whole copy in their dtype, vLLM the fp32 weights it converts itself (both run from one
    process only).
    """
    if isinstance(engine, BuiltinEngine):
        return engine.load_stream(gathered_weights(model, engine.dtype), version)
    if isinstance(engine, RayRollout):
        return engine.load_weights(whole_weights(model, engine.dtype), version)
    return engine.load_weights(whole_weights(model), version)
