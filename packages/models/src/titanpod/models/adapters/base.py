"""What every Hugging Face state-dict adapter does: config.json <-> args, and titanpod's tensors
<-> the Hugging Face ones, through one table (the layout) of where each Hugging Face tensor lives.

A layout maps each Hugging Face tensor name to an ``HFSlot``: a titanpod parameter, or one
expert's slice of it, or a range of its rows. ``to_hf`` and ``from_hf`` and the expected
shapes all follow from it, so a family writes only its layout and its config translation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

if TYPE_CHECKING:
    import torch


ArgsT = TypeVar("ArgsT")


class UnsupportedConfigError(ValueError):
    """A Hugging Face config.json describes a model titanpod cannot represent exactly (or the reverse)."""


class HFSlot(NamedTuple):
    """Where a Hugging Face tensor lives in titanpod: a whole parameter, one expert of it, or a row range."""

    name: str
    """titanpod parameter name."""
    expert: int | None = None
    """Expert index into the parameter's first dimension (the tensor drops that dimension), or ``None``."""
    rows: tuple[int, int] | None = None
    """``(start, stop)`` rows of the parameter's first axis, or ``None``."""

    def view(self, param: torch.Tensor) -> torch.Tensor:
        """The part of ``param`` this slot names: a view, no copy."""
        if self.expert is not None:
            return param[self.expert]
        if self.rows is not None:
            return param[self.rows[0] : self.rows[1]]
        return param

    def describe(self) -> str:
        """The slot in words, e.g. ``layers.0.feed_forward.experts.w1.weight expert 3``."""
        if self.expert is not None:
            return f"{self.name} expert {self.expert}"
        if self.rows is not None:
            return f"{self.name} rows {self.rows[0]}:{self.rows[1]}"
        return self.name


class StateDictAdapter(ABC, Generic[ArgsT]):
    """One model family's Hugging Face form: its config.json and its tensor names, both ways.

    A family implements the config translation and ``hf_layout``; the tensor conversions are
    shared. Reading and writing files is titanpod.checkpoint's job.
    """

    @abstractmethod
    def args_from_hf_config(self, config: Mapping[str, Any]) -> ArgsT:
        """The titanpod args of a Hugging Face config.json (as a dict); ``UnsupportedConfigError`` names a
        key titanpod cannot represent."""

    @abstractmethod
    def hf_config_from_args(self, args: ArgsT, dtype: torch.dtype) -> dict[str, Any]:
        """The Hugging Face config.json (as a dict) of ``args``, for tensors stored in ``dtype`` (recorded
        where the format has a field for it)."""

    @abstractmethod
    def hf_layout(self, args: ArgsT) -> Mapping[str, HFSlot]:
        """Every Hugging Face tensor name of a model of shape ``args`` -> its titanpod slot, in the order
        the tensors are written. Together the slots cover every parameter exactly once."""

    def to_hf(self, state: Mapping[str, torch.Tensor], args: ArgsT) -> Iterator[tuple[str, torch.Tensor]]:
        """``state`` (titanpod names) as Hugging Face-named tensors: views, no copies, so copying into one
        fills ``state``. ``KeyError`` names a parameter ``state`` lacks."""
        for hf_name, slot in self.hf_layout(args).items():
            if slot.name not in state:
                raise KeyError(f"The state has no {slot.name}, which Hugging Face's {hf_name} comes from.")
            yield hf_name, slot.view(state[slot.name])

    def hf_shapes(self, state: Mapping[str, torch.Tensor], args: ArgsT) -> dict[str, tuple[int, ...]]:
        """Hugging Face name -> shape, for a model whose parameters are ``state`` (meta tensors will do)."""
        return {hf_name: tuple(tensor.shape) for hf_name, tensor in self.to_hf(state, args)}

    def from_hf(self, hf_state: Mapping[str, torch.Tensor], args: ArgsT) -> dict[str, torch.Tensor]:
        """Hugging Face-named tensors as a titanpod state dict: experts stacked, row ranges concatenated.

        Strict: a missing or unexpected name is a ``KeyError`` that names it.
        """
        layout = self.hf_layout(args)
        missing = [f"{name} (titanpod {slot.describe()})" for name, slot in layout.items() if name not in hf_state]
        unexpected = sorted(set(hf_state) - set(layout))
        if missing or unexpected:
            raise KeyError(
                f"The Hugging Face tensors do not fit the model: missing {missing or 'none'}, "
                f"unexpected {unexpected or 'none'}."
            )
        import torch  # here: reading the adapters (a recipe's families) needs no torch

        parts: dict[str, list[tuple[HFSlot, torch.Tensor]]] = {}
        for hf_name, slot in layout.items():
            parts.setdefault(slot.name, []).append((slot, hf_state[hf_name]))
        state: dict[str, torch.Tensor] = {}
        for name, pieces in parts.items():
            first = pieces[0][0]
            if first.expert is not None:
                state[name] = torch.stack([t for _, t in sorted(pieces, key=lambda piece: piece[0].expert)])
            elif first.rows is not None:
                state[name] = torch.cat([t for _, t in sorted(pieces, key=lambda piece: piece[0].rows)])
            else:
                state[name] = pieces[0][1]
        return state
