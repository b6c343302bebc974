"""The tensors of a trainer's state as DCP saves and loads them, and the check that a step's state is one saved."""

from __future__ import annotations

from typing import Any

from torch import nn

from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.rng_state import RNG_KEY, rng_state
from titanpod.graph import TrainStep


def trainer_state_dict(model: nn.Module, step: TrainStep) -> dict[str, Any]:
    """The tensors of a trainer's state, as DCP saves and loads them (in place), for a step whose
    ``state_format`` is ``torch``: ``{"model": {name: param}, "optim": step.state_dict(), "rng": {...}}``.

    Parameters are the model's own tensors (DTensors when sharded); the step lays out its AdamW
    moments like their parameters (DTensors over this rank's shards), so both reshard on load.
    """
    check_format(step, "torch")
    params = {name: param.detach() for name, param in model.named_parameters()}
    return {"model": params, "optim": step.state_dict(), RNG_KEY: rng_state(model)}


def check_format(step: TrainStep, *saved: str) -> str:
    """``step.state_format``, after checking it is one of ``saved`` (the formats the caller saves)."""
    if step.state_format not in saved:
        raise CheckpointError(
            f"{type(step).__name__} declares state_format={step.state_format!r}; this is saved from steps whose "
            f"state is {' or '.join(repr(name) for name in saved)} (see titanpod.graph.TrainStep.state_format)."
        )
    return step.state_format
