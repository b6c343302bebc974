"""Weight sync from a trainer to a rollout engine: a content checksum, key accounting, the helper."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import xxhash
from torch import nn

from titanpod.rl.rollout.types import RolloutEngine, SyncReport

_COMPILE_PREFIX = "_orig_mod."


def plain_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor as a plain, contiguous CPU tensor (a DTensor is gathered first)."""
    full_tensor = getattr(tensor, "full_tensor", None)
    if callable(full_tensor):  # DTensor: every rank gets the whole value
        tensor = full_tensor()
    return tensor.detach().contiguous().cpu()


class ChecksumStream:
    """``weights_checksum`` built one tensor at a time: feed the tensors in sorted name order (``add``), then read
    ``hexdigest``. Equal to ``weights_checksum`` of the same tensors, without holding them all at once."""

    def __init__(self) -> None:
        self._digest = xxhash.xxh3_128()
        self._last: str | None = None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Hash ``name`` and ``tensor`` (its dtype, shape and bytes); ``ValueError`` when ``name`` does not come
        after the previous one in sorted order."""
        if self._last is not None and name <= self._last:
            raise ValueError(f"Checksum stream got {name!r} after {self._last!r}: feed tensors in sorted name order.")
        self._last = name
        plain = plain_tensor(tensor)
        header = f"{name}\0{plain.dtype}\0{tuple(plain.shape)}\0{plain.numel() * plain.element_size()}\n"
        self._digest.update(header.encode())
        if plain.numel():
            self._digest.update(plain.reshape(-1).view(torch.uint8).numpy().data)

    def hexdigest(self) -> str:
        """The checksum of the tensors added so far."""
        return self._digest.hexdigest()


def weights_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """An XXH3-128 digest of every tensor's name, dtype, shape and bytes, in sorted name order (as sure as a
    cryptographic hash of a changed byte, and many times faster: a sync hashes every weight on both sides).

    Independent of the mapping's order; any change of a value, dtype, shape or name changes
    it. Costs one read of every tensor (copied to the CPU one at a time).
    """
    stream = ChecksumStream()
    for name in sorted(state):
        stream.add(name, state[name])
    return stream.hexdigest()


def differing_elements(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """How many elements of two same-shaped tensors differ, as a 0-d tensor where they live (NaN equals NaN):
    a copy checked without reading either tensor back to the host."""
    unequal = ours.ne(theirs)
    if ours.is_floating_point():
        unequal &= ~(ours.isnan() & theirs.isnan())
    return unequal.sum()


def state_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of tensor data in ``state``."""
    return sum(t.numel() * t.element_size() for t in state.values())


def check_state_matches(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` naming every missing, unexpected, mis-shaped or mis-typed tensor of ``state``."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{name}: got {list(state[name].shape)} {state[name].dtype}, "
        f"expected {list(expected[name].shape)} {expected[name].dtype}"
        for name in sorted(set(state) & set(expected))
        if state[name].shape != expected[name].shape or state[name].dtype != expected[name].dtype
    ]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected {', '.join(unexpected)}")
    if wrong:
        problems.append("mismatched " + "; ".join(wrong))
    if problems:
        raise ValueError(
            "The weights do not fit the engine's model: " + ". ".join(problems) + ". Sync from a model of the "
            "same family and flavor, in the dtype the engine was built with."
        )


def trainer_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict under plain parameter names (``torch.compile``'s ``_orig_mod.`` removed), detached."""
    return {name.replace(_COMPILE_PREFIX, ""): t.detach() for name, t in model.state_dict().items()}


def check_version(new: int, current: int) -> None:
    """Refuse a weights version that is not newer than the current one, naming both."""
    if new <= current:
        raise ValueError(
            f"Weights version {new} is not newer than the engine's version {current}: "
            "each sync must carry a larger version (e.g. the trainer's step)."
        )


@torch.no_grad()
def sync_weights(trainer_model: nn.Module, engine: RolloutEngine, version: int) -> SyncReport:
    """Copy ``trainer_model``'s weights into ``engine`` as ``version``; the engine verifies the checksum."""
    return engine.load_weights(trainer_state(trainer_model), version)
