"""A JAX function over lists of tensors, run as one program where the tensors are.

Unlike ``jax_op`` (a kernel inside a model, with a gradient), a ``JaxProgram`` is a whole computation with no
gradient, such as an optimizer's update over every parameter. For tensors on the ``tpu`` device it is a torch_tpu op
(``titanpod.kernels.tpu_bridge.register_tpu_program``): one program on the TPU's own buffers that may write its
outputs into the buffers of the arguments it donates. Elsewhere it is ``jax.jit`` of the function on JAX's host
backend, the tensors passed through DLPack and the outputs copied back, without donation.

Legend: none; shapes belong to the wrapped function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class JaxProgram:
    """``fn`` as one program; call it with the lists of tensors named ``lists``, then the tensors named ``arrays``.
    It returns ``fn``'s outputs, a flat tuple of arrays, as a list of tensors on the inputs' device."""

    name: str
    """The op's qualified name, ``titanpod::<name>``: it must say everything ``fn`` closes over."""
    fn: Callable[..., tuple[Any, ...]]
    """The JAX function: the lists, then the arrays, in; a flat tuple of arrays out."""
    lists: tuple[str, ...]
    """The names of the arguments that are lists of tensors, in order, before ``arrays``."""
    arrays: tuple[str, ...]
    """The names of the arguments that are single tensors."""
    donate: tuple[str, ...] = ()
    """Arguments whose buffers the program may write its outputs into on a TPU: the tensors passed for them are
    invalid afterwards (give each a new value, ``tensor.data = output``)."""
    _tpu_op: Any = field(default=None, repr=False)
    _jitted: Any = field(default=None, repr=False)

    def __call__(self, *args: Any) -> list[torch.Tensor]:
        if len(args) != len(self.lists) + len(self.arrays):
            raise TypeError(f"{self.name} takes {', '.join((*self.lists, *self.arrays))}; got {len(args)} arguments.")
        device = next(t.device for t in _tensors(args))
        if device.type == "tpu":
            if self._tpu_op is None:
                from titanpod.kernels.tpu_bridge import register_tpu_program

                self._tpu_op = register_tpu_program(self.name, self.fn, self.lists, self.arrays, self.donate)
            return list(self._tpu_op(*args))
        return self._on_host(args, device)

    def _on_host(self, args: Sequence[Any], device: torch.device) -> list[torch.Tensor]:
        import jax

        from titanpod.kernels.jax_custom_op import to_jax, to_torch

        if self._jitted is None:
            self._jitted = jax.jit(self.fn)
        arrays = [[to_jax(t) for t in arg] if isinstance(arg, list | tuple) else to_jax(arg) for arg in args]
        return [to_torch(out, device) for out in self._jitted(*arrays)]


def _tensors(args: Sequence[Any]) -> list[torch.Tensor]:
    found = [t for arg in args for t in (arg if isinstance(arg, list | tuple) else [arg])]
    if not found:
        raise ValueError("A JaxProgram needs at least one tensor to know its device.")
    return found
