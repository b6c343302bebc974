"""Running a model on parameter tensors other than its own, for functional steps."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn


def parameter_slots(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """Where each of ``model.named_parameters()`` lives: (owning module, attribute name), in order."""
    slots = []
    for name, _ in model.named_parameters():
        owner, _, attr = name.rpartition(".")
        slots.append((model.get_submodule(owner), attr))
    return slots


@contextmanager
def parameters_bound(model: nn.Module, tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Make ``model`` read ``tensors`` (in ``named_parameters`` order) in place of its parameters.

    The swap is in each module's ``_parameters`` dict, which is also what the sharded
    parameter readers of ``titanpod.parallel`` read, so a sharded model works too. The
    model's own parameters are put back on exit, whatever happened.
    """
    slots = parameter_slots(model)
    if len(slots) != len(tensors):
        raise ValueError(f"The model has {len(slots)} parameters but {len(tensors)} tensors were given.")
    originals = [module._parameters[attr] for module, attr in slots]
    try:
        for (module, attr), tensor in zip(slots, tensors, strict=True):
            module._parameters[attr] = tensor  # type: ignore[assignment]
        yield
    finally:
        for (module, attr), original in zip(slots, originals, strict=True):
            module._parameters[attr] = original
