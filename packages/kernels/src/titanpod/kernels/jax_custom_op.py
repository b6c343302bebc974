"""``jax_op``: a JAX function (a Pallas kernel included) as a PyTorch custom op with autograd.

The op is a ``torch.library`` custom op: ``make_fx`` and ``torch.compile`` see one node.
Its fake (meta) implementation comes from ``jax.eval_shape``; its gradient is a second
custom op running ``jax.vjp``. On the CPU (and CUDA) inputs reach JAX through DLPack
without copies; outputs are copied out of JAX's buffers. On the tpu lane (tensors on the
``tpu`` device) the forward and its gradient are torch_tpu ops instead
(``titanpod.kernels.tpu_bridge``), which run on the TPU's own buffers and which torch_tpu's
compiler lowers as kernels of its own.
On the xla lane (torchax tensors, inside a ``jax_view`` trace) there is no torch op at
all: the JAX function runs on the tensors' JAX values, where JAX's autodiff and ``jax.jit``
see it, split over the context mesh by the kernel's ``shard`` rule.

Legend: none; shapes belong to the wrapped function.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from titanpod.kernels.jax_autodiff import as_tuple, floating_indices, register_jax_autograd, vjp_function
from titanpod.kernels.tpu_bridge import TpuKernel

NAMESPACE = "titanpod"

_TORCH_TO_JAX = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                 torch.int32: "int32", torch.int64: "int64", torch.bool: "bool"}  # fmt: skip


def to_jax(tensor: torch.Tensor) -> Any:
    """``tensor`` as a JAX array sharing its memory (DLPack); ``TypeError`` for a dtype JAX is not given."""
    import jax

    if tensor.dtype not in _TORCH_TO_JAX:
        raise TypeError(f"jax_op cannot pass a {tensor.dtype} tensor to JAX; use one of {list(_TORCH_TO_JAX)}.")
    return jax.dlpack.from_dlpack(tensor.detach().contiguous())


def to_torch(array: Any, device: torch.device) -> torch.Tensor:
    """A copy of JAX ``array`` as a tensor on ``device`` (assembled on the host when spread over a mesh)."""
    if len(array.sharding.device_set) > 1:  # spread over a mesh: assemble it on the host
        import numpy as np

        return torch.from_numpy(np.array(array)).to(device)
    # A tensor made by from_dlpack shares JAX's buffer, which JAX may reuse: copy it out.
    return torch.from_dlpack(array).to(device).clone()


def _torch_dtype(jax_dtype: Any) -> torch.dtype:
    name = str(jax_dtype)
    for torch_dtype, jax_name in _TORCH_TO_JAX.items():
        if jax_name == name:
            return torch_dtype
    raise TypeError(f"jax_op cannot return JAX dtype {name} to PyTorch.")


def shape_structs(tensors: Sequence[torch.Tensor]) -> list[Any]:
    import jax
    import jax.numpy as jnp

    """JAX's description (shape, dtype) of each tensor, for ``jax.eval_shape``."""
    return [jax.ShapeDtypeStruct(tuple(t.shape), jnp.dtype(_TORCH_TO_JAX[t.dtype])) for t in tensors]


def pallas_interpret(setting: bool | None, device: torch.device) -> bool:
    """Whether a Pallas kernel for tensors on ``device`` runs in interpret mode.

    An explicit ``setting`` wins. Tensors on the ``tpu`` device (torch_tpu) run the compiled
    kernel, without asking JAX for its backend (which would make JAX claim the TPU torch_tpu
    holds). Elsewhere the kernel is compiled where JAX's context mesh (``jax.set_mesh``: the
    xla lane's step, also when compiled ahead of time for a TPU topology from a host without
    one) is of TPUs; with no mesh in context, torchax tensors (device ``jax``) compile where
    JAX's default backend is a TPU, and host (or GPU) tensors, which reach JAX through DLPack on
    their own backend, always interpret: Mosaic lowers only for a TPU, also on a TPU machine.
    """
    if setting is not None:
        return setting
    if device.type == "tpu":
        return False
    import jax

    mesh_device = jax.sharding.get_abstract_mesh().abstract_device  # None without a mesh of devices
    if mesh_device is not None:
        return mesh_device.platform != "tpu"
    if device.type == "jax":
        return jax.default_backend() != "tpu"
    return True


@dataclass(frozen=True)
class JaxOp:
    """A JAX function registered as a PyTorch op; call it with tensors.

    Every floating-point input receives a gradient; integer inputs (ids, sizes) receive none.
    """

    name: str
    """The op's qualified name, ``titanpod::<name>``."""
    fn: Callable[..., Any]
    """The JAX function: positional arrays in, one array or a tuple of arrays out."""
    forward_op: Any
    """The registered forward custom op (``Tensor[] -> Tensor[]``)."""
    backward_op: Any
    """The registered backward custom op (inputs + output cotangents -> floating inputs' gradients)."""
    tpu: TpuKernel | None = None
    """The same function as torch_tpu ops, for tensors on the ``tpu`` device (registered on first use)."""
    shard: Callable[..., Callable[..., Any]] | None = None
    """On the xla lane over a mesh of several devices: ``shard(fn, mesh, *arrays)`` gives the
    function to run in place of ``fn`` (a ``jax.shard_map`` of it: XLA cannot partition a
    Pallas call). ``None`` leaves ``fn`` to XLA's SPMD partitioner."""

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if holds_torchax_tensors(inputs):
            return self.call_in_jax(*inputs)
        if self.tpu is not None and inputs[0].device.type == "tpu":
            outputs = self.tpu(*inputs)
        else:
            outputs = self.forward_op(list(inputs))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def call_in_jax(self, *inputs: torch.Tensor) -> Any:
        """``fn`` on torchax tensors' JAX values (the xla lane), its result as torchax tensors.

        Runs inside the caller's JAX trace, so ``jax.value_and_grad`` differentiates ``fn``
        itself and ``jax.jit`` compiles it into the step. When JAX's context mesh
        (``jax.set_mesh``) has several devices, ``fn`` runs as the ``shard`` rule splits it.
        """
        from torchax.interop import jax_view, torch_view

        return torch_view(self.in_jax(*jax_view(list(inputs))))

    def in_jax(self, *arrays: Any) -> Any:
        """``fn`` on JAX arrays (or tracers) as ``call_in_jax`` runs it: when JAX's context mesh
        (``jax.set_mesh``) has several devices, split over it by the ``shard`` rule."""
        import jax

        mesh = jax.sharding.get_abstract_mesh()
        fn = self.fn
        if self.shard is not None and not mesh.empty and mesh.size > 1:
            fn = self.shard(fn, mesh, *arrays)
        return fn(*arrays)


def holds_torchax_tensors(tensors: Sequence[Any]) -> bool:
    """Whether any of ``tensors`` is a torchax tensor (only possible once torchax is imported)."""
    module = sys.modules.get("torchax.tensor")
    if module is None:
        return False
    kinds = tuple(getattr(module, name) for name in ("Tensor", "View") if hasattr(module, name))
    return any(isinstance(t, kinds) for t in tensors)


def _run(
    fn: Callable[..., Any], tensors: list[torch.Tensor], specs: Sequence[Any] | None, mesh: Any
) -> list[torch.Tensor]:
    """Run ``fn`` (already ``jax.jit``-ed) on the tensors' data and hand back tensors."""
    import jax

    device = tensors[0].device
    arrays = list(map(to_jax, tensors))
    if mesh is not None and specs is not None:
        arrays = [
            jax.device_put(a, jax.sharding.NamedSharding(mesh, spec)) for a, spec in zip(arrays, specs, strict=True)
        ]
    results = as_tuple(fn(*arrays))
    return [to_torch(result, device) for result in results]


def free_op_name(base: str) -> str:
    """``base``, or ``base_2``, ``base_3`` ... when ops of that name are registered already in this process.

    Names made this way depend only on what was registered before, not on object ids, so the same
    program names its ops the same in every run (a captured step's code, which keys the compiled-step
    cache, names them).
    """
    namespace = getattr(torch.ops, NAMESPACE)
    name, suffix = base, 1
    while hasattr(namespace, name):
        suffix += 1
        name = f"{base}_{suffix}"
    return name


def jax_op(
    name: str,
    fn: Callable[..., Any],
    *,
    mesh: Any = None,
    in_specs: tuple[Any, ...] | None = None,
    out_specs: Any = None,
    shard: Callable[..., Callable[..., Any]] | None = None,
) -> JaxOp:
    """Register ``fn`` (JAX arrays in, an array or a tuple of arrays out) as the op ``titanpod::<name>``.

    With a ``jax.sharding.Mesh`` and partition specs, ``fn`` runs once per shard
    (``jax.shard_map``) on the xla lane's sharded arrays. Each name registers once per
    process: build ops when a model is set up, not per step. ``shard`` (see ``JaxOp.shard``)
    splits ``fn`` over the xla lane's mesh when the op is called with torchax tensors.
    """
    qualified = f"{NAMESPACE}::{name}"
    n_inputs = len(inspect.signature(fn).parameters)
    if mesh is not None:
        import jax

        if in_specs is None or out_specs is None:
            raise ValueError(f"jax_op {name!r}: a mesh needs in_specs and out_specs (one PartitionSpec per array).")
        fn = jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)

    out_list = list(out_specs) if isinstance(out_specs, (tuple, list)) else [out_specs]
    # Jitted once each: the forward and one vjp per set of differentiated inputs.
    jitted: dict[tuple[int, ...] | None, Callable[..., Any]] = {}

    def run(
        wrt: tuple[int, ...] | None, tensors: list[torch.Tensor], specs: Sequence[Any] | None
    ) -> list[torch.Tensor]:
        if tensors[0].device.type == "tpu":
            raise RuntimeError(
                f"{qualified} runs tensors on the tpu device through its torch_tpu ops (JaxOp.tpu); "
                "call the JaxOp, not its forward_op."
            )
        if wrt not in jitted:
            import jax

            jitted[wrt] = jax.jit(fn if wrt is None else vjp_function(fn, n_inputs, list(wrt)))
        return _run(jitted[wrt], tensors, specs, mesh)

    @torch.library.custom_op(qualified, mutates_args=())
    def forward_op(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return run(None, inputs, in_specs)

    @forward_op.register_fake
    def _(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        import jax

        shapes = as_tuple(jax.eval_shape(fn, *shape_structs(inputs)))
        return [torch.empty(s.shape, dtype=_torch_dtype(s.dtype), device=inputs[0].device) for s in shapes]

    @torch.library.custom_op(f"{qualified}_backward", mutates_args=())
    def backward_op(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        specs = None if in_specs is None else [*in_specs, *out_list]
        return run(tuple(floating_indices(tensors[:n_inputs])), tensors, specs)

    @backward_op.register_fake
    def _(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        # Contiguous, as the real gradients come out of JAX (``empty_like`` would keep a
        # transposed input's strides, and views traced on those fail on the real tensors).
        return [torch.empty(tensors[i].shape, dtype=tensors[i].dtype, device=tensors[i].device)
                for i in floating_indices(tensors[:n_inputs])]  # fmt: skip

    register_jax_autograd(forward_op, backward_op, packed=True)
    # No torch_tpu path for a kernel split over a JAX mesh: those run on the xla lane's arrays.
    tpu = TpuKernel(qualified, fn, n_inputs) if mesh is None else None
    return JaxOp(qualified, fn, forward_op, backward_op, tpu, None if mesh is not None else shard)
