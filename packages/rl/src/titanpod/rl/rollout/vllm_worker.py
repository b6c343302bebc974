"""What runs inside vLLM's workers: titanpod's worker extension (loading synced weights, checksumming them).

vLLM mixes the class named by ``worker_extension_cls`` into each of its workers (GPU or CPU); ``LLM.collective_rpc``
then calls its methods by name on every worker, with arguments that vLLM serializes as plain data (CPU
tensors travel as raw buffers). Nothing here imports vLLM: the methods use the worker's ``reload_weights``
(vLLM's in-place reload: each layer's weights go through its loader, then the layer's post-load processing runs
again), the worker's model (``self.model_runner.model``) and its parameters.

The checksum is read back from the parameters the worker holds, in vLLM's layout: a fused ``qkv_proj``
holds q, k and v one after another along its rows, ``gate_up_proj`` holds gate then up, a fused-MoE layer
holds every expert's gate and up in ``w13_weight`` [E, 2I, M] and its down in ``w2_weight`` [E, M, I], and
the embedding and output head may carry padding rows past the vocabulary. Each Hugging Face tensor that
was sent is cut back out of that layout, so the checksum equals the trainer's only when every sent tensor
sits, bit for bit, where vLLM's loaders put it.

vLLM's CPU build packs each linear layer's weight into its GEMM kernel's own format after loading and leaves
an empty parameter behind (nothing to read back). For a tensor whose vLLM parameter is empty, the checksum
takes the tensor as the worker received it (after transport, before loading): the worker keeps those tensors
from the last sync. That checks the transport, not the placement; the placement is checked by comparing
vLLM's logprobs with the trainer's (envs/vllm's tests).

Legend: E experts, I expert hidden width, M model dim.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from titanpod.rl.rollout.sync import weights_checksum
from titanpod.rl.rollout.wire import ByteTensor, tensor_from_bytes

TensorSpec = tuple[str, tuple[int, ...]]
"""A Hugging Face tensor name and its shape (what ``read_back`` cuts out of the worker's parameters)."""

FUSED_PROJECTIONS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "q_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "k_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "v_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "gate_proj": ("gate_up_proj", ("gate_proj", "up_proj")),
    "up_proj": ("gate_up_proj", ("gate_proj", "up_proj")),
}
"""A Hugging Face projection -> the vLLM parameter that fuses it, and the parts that parameter holds in order."""

_EXPERT = re.compile(
    r"^(?P<layer>.+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<projection>gate_proj|up_proj|down_proj)\.weight$"
)
_PROJECTION = re.compile(r"^(?P<module>.+)\.(?P<projection>[a-z_]+)\.weight$")


def _within(parameter: torch.Tensor, shape: Sequence[int], name: str, where: str) -> torch.Tensor:
    """``parameter`` cut to ``shape`` (leading rows/columns; the rest is vLLM's padding), or ``ValueError``."""
    if parameter.dim() != len(shape) or any(have < want for have, want in zip(parameter.shape, shape, strict=True)):
        raise ValueError(
            f"{name} ({list(shape)}) does not fit vLLM's {where} ({list(parameter.shape)}): the engine was built "
            "for a different model shape."
        )
    for dim, size in enumerate(shape):
        parameter = parameter.narrow(dim, 0, size)
    return parameter


def _rows(parameter: torch.Tensor, offset: int, shape: Sequence[int], name: str, where: str) -> torch.Tensor:
    """Rows ``offset .. offset + shape[0]`` of ``parameter``, cut to ``shape``, or ``ValueError``."""
    if offset + shape[0] > parameter.shape[0]:
        raise ValueError(
            f"{name} (rows {offset}..{offset + shape[0]}) lies past vLLM's {where} ({parameter.shape[0]} rows): "
            "the engine was built for a different model shape."
        )
    return _within(parameter.narrow(0, offset, shape[0]), shape, name, where)


def _expert_slice(params: Mapping[str, torch.Tensor], match: re.Match[str], shape: Sequence[int]) -> torch.Tensor:
    """One expert's gate, up or down projection out of its layer's fused-MoE parameters."""
    layer, expert, projection = match["layer"], int(match["expert"]), match["projection"]
    fused = "w2_weight" if projection == "down_proj" else "w13_weight"
    where = f"{layer}.{fused}"
    parameter = _parameter(params, where, match.string)
    if expert >= parameter.shape[0]:
        raise ValueError(f"{match.string}: vLLM's {where} holds {parameter.shape[0]} experts, not {expert + 1}.")
    offset = shape[0] if projection == "up_proj" else 0  # w13 holds gate's rows, then up's
    return _rows(parameter[expert], offset, shape, match.string, f"{where}[{expert}]")


def _fused_slice(
    params: Mapping[str, torch.Tensor], shapes: Mapping[str, Sequence[int]], module: str, projection: str, name: str
) -> torch.Tensor:
    """A projection's rows of the parameter vLLM fuses it into (after the rows of the parts before it)."""
    fused, parts = FUSED_PROJECTIONS[projection]
    where = f"{module}.{fused}.weight"
    parameter = _parameter(params, where, name)
    offset = 0
    for part in parts[: parts.index(projection)]:
        sibling = f"{module}.{part}.weight"
        if sibling not in shapes:
            raise ValueError(f"{name} is fused with {sibling} in vLLM's {where}, but {sibling} was not sent.")
        offset += shapes[sibling][0]
    return _rows(parameter, offset, shapes[name], name, where)


def _parameter(params: Mapping[str, torch.Tensor], where: str, name: str) -> torch.Tensor:
    """``params[where]``, or ``ValueError`` saying that ``name`` was looked for there."""
    if where not in params:
        raise ValueError(
            f"vLLM's model holds no parameter {where}, where {name} should be. Its parameters begin: "
            f"{', '.join(list(params)[:6])}. The model class vLLM picked does not lay weights out as titanpod expects."
        )
    return params[where]


def holder(name: str) -> str:
    """The vLLM parameter that holds Hugging Face tensor ``name`` (a fused one, for a fused projection)."""
    expert = _EXPERT.match(name)
    if expert is not None:
        return f"{expert['layer']}.{'w2_weight' if expert['projection'] == 'down_proj' else 'w13_weight'}"
    projection = _PROJECTION.match(name)
    if projection is not None and projection["projection"] in FUSED_PROJECTIONS:
        return f"{projection['module']}.{FUSED_PROJECTIONS[projection['projection']][0]}.weight"
    return name


def packed(params: Mapping[str, torch.Tensor], specs: Sequence[TensorSpec]) -> list[str]:
    """The names of ``specs`` whose vLLM parameter is empty: packed into a kernel's format, unreadable."""
    return [name for name, _ in specs if holder(name) in params and params[holder(name)].numel() == 0]


def read_back(
    params: Mapping[str, torch.Tensor], specs: Sequence[TensorSpec], skip: Sequence[str] = ()
) -> dict[str, torch.Tensor]:
    """Every Hugging Face tensor of ``specs``, cut (as views) out of vLLM's ``params``, by name.

    A name vLLM keeps as it is is read whole (less any padding); a projection vLLM fuses is its rows of the
    fused parameter (offsets from the shapes of the parts before it, which must be in ``specs``); an
    expert's projection is its slice of the layer's ``w13_weight`` / ``w2_weight``. ``ValueError`` names a
    tensor that cannot be found or does not fit. Names in ``skip`` are not read (their shapes still give the
    offsets of the parts after them).
    """
    shapes = {name: tuple(shape) for name, shape in specs}
    tensors = {}
    for name, shape in shapes.items():
        if name in skip:
            continue
        expert = _EXPERT.match(name)
        projection = _PROJECTION.match(name)
        if name in params:
            tensors[name] = _within(params[name], shape, name, name)
        elif expert is not None:
            tensors[name] = _expert_slice(params, expert, shape)
        elif projection is not None and projection["projection"] in FUSED_PROJECTIONS:
            tensors[name] = _fused_slice(params, shapes, projection["module"], projection["projection"], name)
        else:
            _parameter(params, name, name)  # raises, naming what the model holds
    return tensors


def refresh_packed_copies(model: Any) -> int:
    """Re-run the post-load processing of every layer that keeps its weight beside a packed copy of it (vLLM's CPU
    build does this for the embedding and the output head: ``cpu_linear`` holds the copy); the number refreshed.

    A tied head shares the embedding's weight and is not reloaded itself, so ``reload_weights`` leaves its packed
    copy holding the old values (its logprobs stay those of the old weights while the weight reads back new).
    Layers whose weight was packed away (empty) were reprocessed by the reload and are left alone.
    """
    refreshed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.numel() and method:
            method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed


class TitanpodWorkerExtension:
    """Mixed into each vLLM worker (``worker_extension_cls``); called through ``LLM.collective_rpc``.

    ``self.model_runner.model`` is the worker's model: vLLM's model class for the checkpoint's architecture,
    whose ``load_weights`` takes (Hugging Face name, tensor) pairs and routes each through its loader.
    """

    model_runner: Any
    """Set by vLLM's worker: holds ``model``."""
    reload_weights: Any
    """vLLM's worker method: ``reload_weights(weights_iterator=...)`` hands its arguments to the model runner's,
    which loads the weights in place and re-runs each layer's post-load processing."""

    def titanpod_load_weights(self, names: list[str], sent: list[ByteTensor]) -> int:
        """Load the ``sent`` tensors (``ByteTensor``s, in the engine's dtype) under their Hugging Face ``names`` in
        place; the number loaded. A layer's tensors must all come in one call (its processing runs once they
        have)."""
        if len(names) != len(sent):
            raise ValueError(f"titanpod_load_weights got {len(names)} names for {len(sent)} tensors.")
        tensors = [tensor_from_bytes(item) for item in sent]
        params = dict(self.model_runner.model.named_parameters())
        device = next(iter(params.values())).device
        weights = [(name, tensor.to(device)) for name, tensor in zip(names, tensors, strict=True)]
        if "weights_iterator" not in inspect.signature(self.model_runner.reload_weights).parameters:
            raise RuntimeError(
                "This vLLM's workers cannot load weights in place (their model runner's reload_weights takes no "
                "weights_iterator): "
                "titanpod's weight sync needs a vLLM with in-place reloading (0.32 has it); upgrade vLLM."
            )
        self.reload_weights(weights_iterator=weights)
        refresh_packed_copies(self.model_runner.model)
        received: dict[str, torch.Tensor] = getattr(self, "_titanpod_received", {})
        params = dict(self.model_runner.model.named_parameters())
        by_name = dict(zip(names, tensors, strict=True))
        for name in packed(params, [(name, tuple(tensor.shape)) for name, tensor in by_name.items()]):
            received[name] = by_name[name]
        self._titanpod_received = received
        return len(names)

    def titanpod_checksum(self, specs: list[tuple[str, list[int]]]) -> str:
        """``weights_checksum`` of the Hugging Face tensors of ``specs`` as this worker holds them (``read_back``);
        a tensor whose vLLM parameter is packed (empty) counts as the worker received it at the last sync."""
        shaped = [(name, tuple(shape)) for name, shape in specs]
        params = dict(self.model_runner.model.named_parameters())
        unreadable = packed(params, shaped)
        received: dict[str, torch.Tensor] = getattr(self, "_titanpod_received", {})
        missing = [name for name in unreadable if name not in received]
        if missing:
            raise ValueError(
                f"vLLM holds {', '.join(missing[:4])} packed for its kernels (nothing to read back) and no sync has "
                "sent them to this worker: sync the weights before asking for their checksum."
            )
        tensors = {**read_back(params, shaped, skip=unreadable), **{name: received[name] for name in unreadable}}
        return weights_checksum(tensors)
