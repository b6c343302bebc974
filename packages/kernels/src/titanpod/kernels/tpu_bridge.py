"""The tpu lane's path for ``jax_op``: the JAX function and its gradient registered with torch_tpu's
Pallas bridge (``torch.tpu.pallas.jax_op``), which runs JAX on the TPU's own buffers.

torch_tpu reads a kernel's signature (``inspect.signature(..., eval_str=True)``) to build the op's
schema: every argument needs a type it knows and the count must be explicit (PyTorch's schema
inference refuses ``*args``). Each kernel here gets a signature of exactly as many ``jax.Array``
arguments as it takes, ``x0 .. x{n-1}``, returning ``tuple[jax.Array, ...]`` (``Tensor[]``).
The ops are registered on the first call with tensors on the ``tpu`` device, so no other lane
imports torch_tpu. Their fake (meta) implementations are torch_tpu's own: the kernel exported
for the TPU platform, which needs no chip.

Legend: none; shapes belong to the wrapped function.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from titanpod.kernels.jax_autodiff import as_tuple, floating_indices, register_jax_autograd, vjp_function


def explicit_signature(n_arrays: int) -> inspect.Signature:
    """``(x0: jax.Array, ..., x{n-1}: jax.Array) -> tuple[jax.Array, ...]``: what torch_tpu can read."""
    import jax

    parameters = [
        inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=jax.Array)
        for i in range(n_arrays)
    ]
    return inspect.Signature(parameters, return_annotation=tuple[jax.Array, ...])


def explicit_arity(fn: Callable[..., Any], n_arrays: int) -> Callable[..., tuple[Any, ...]]:
    """``fn`` returning a tuple, with ``explicit_signature(n_arrays)`` as its signature."""

    def kernel(*arrays: Any) -> tuple[Any, ...]:
        return as_tuple(fn(*arrays))

    kernel.__signature__ = explicit_signature(n_arrays)  # type: ignore[attr-defined]
    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def named_signature(lists: Sequence[str], arrays: Sequence[str]) -> inspect.Signature:
    """``(l0: list[jax.Array], ..., a0: jax.Array, ...) -> tuple[jax.Array, ...]``, with the given names."""
    import jax

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter(name, kind, annotation=list[jax.Array]) for name in lists]
    parameters += [inspect.Parameter(name, kind, annotation=jax.Array) for name in arrays]
    return inspect.Signature(parameters, return_annotation=tuple[jax.Array, ...])


def register_tpu_program(
    qualified_name: str, fn: Callable[..., Any], lists: Sequence[str], arrays: Sequence[str], donate: Sequence[str]
) -> Any:
    """``fn`` (lists of arrays named ``lists``, then arrays named ``arrays``; a flat tuple out) as the torch_tpu op
    ``qualified_name``, run as one program on the TPU's own buffers; the registered op where one of that name is
    already (the name must say everything ``fn`` closes over). The arguments named in ``donate`` are donated: the
    program may write its outputs into their buffers, and the tensors passed for them are invalid afterwards."""
    import torch_tpu  # noqa: F401 - provides torch.tpu

    namespace, name = qualified_name.split("::")
    with contextlib.suppress(AttributeError, RuntimeError):
        return getattr(getattr(torch.ops, namespace), name)

    def program(*args: Any) -> tuple[Any, ...]:
        return as_tuple(fn(*args))

    program.__signature__ = named_signature(lists, arrays)  # type: ignore[attr-defined]
    program.__name__ = name
    names = [*lists, *arrays]
    donate_argnums = [names.index(argument) for argument in donate]
    return torch.tpu.pallas.jax_op(qualified_name, program, donate_argnums=donate_argnums)  # type: ignore[attr-defined]


def register_tpu_kernel(qualified_name: str, fn: Callable[..., Any], n_arrays: int) -> Any:
    """Register ``fn`` (``n_arrays`` JAX arrays in) as the torch_tpu op ``qualified_name``."""
    import torch_tpu  # noqa: F401 - provides torch.tpu

    return torch.tpu.pallas.jax_op(qualified_name, explicit_arity(fn, n_arrays))  # type: ignore[attr-defined]


@dataclass
class TpuKernel:
    """A ``jax_op`` function as torch_tpu ops with autograd, registered on first use.

    The forward op is ``<name>_tpu``; the gradient op (inputs + output cotangents in, the
    floating inputs' gradients out) is ``<name>_tpu_backward``.
    """

    qualified_name: str
    """The ``jax_op``'s name, ``titanpod::<name>``; the torch_tpu ops add ``_tpu`` to it."""
    fn: Callable[..., Any]
    """The JAX function."""
    n_inputs: int
    """How many arrays ``fn`` takes."""
    _forward: Any = field(default=None, repr=False)

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        if self._forward is None:
            self._forward = self._register(inputs)
        return list(self._forward(*inputs))

    def _register(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        import jax

        from titanpod.kernels.jax_custom_op import shape_structs

        if len(inputs) != self.n_inputs:
            raise TypeError(f"{self.qualified_name} takes {self.n_inputs} tensors, got {len(inputs)}.")
        n_outputs = len(as_tuple(jax.eval_shape(self.fn, *shape_structs(inputs))))
        wrt = floating_indices(inputs)
        forward = register_tpu_kernel(f"{self.qualified_name}_tpu", self.fn, self.n_inputs)
        backward = register_tpu_kernel(
            f"{self.qualified_name}_tpu_backward", vjp_function(self.fn, self.n_inputs, wrt), self.n_inputs + n_outputs
        )
        register_jax_autograd(forward, lambda tensors: backward(*tensors), packed=False)
        return forward
