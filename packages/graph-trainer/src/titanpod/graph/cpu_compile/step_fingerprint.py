"""The key of a whole step computed before it is captured, so a cached start can skip the capture.

``titanpod.graph.cpu_compile.compiled_steps`` keys a compiled step by its captured graph, which takes a
capture (about 1.5 s at the Llama 3 debug shape on a 2-core CPU) to know. ``step_fingerprint``
covers what that graph is made from instead, so a later run of the same recipe finds the
compiled step without capturing it:

- the code: the content of every source file of titanpod's packages and of the files that define
  the model's module classes and the functions in its op slots (a user's own model or kernel),
  the versions of torch and of the libraries the kernels call (``LIBRARIES``), and the code
  objects of the functions the step is built with (``step_fingerprint``'s ``builders``), so
  replacing one at run time changes the key;
- the model: its module tree, each parameter's and buffer's name, shape, strides, dtype, device
  and sharding (mesh and placements), its ``args`` and the ops in its slots (functions by their
  code, other objects by their ``repr``);
- the step: the training config, each parameter's weight decay and every input's shape,
  strides and dtype;
- the process: torch's build, Python, the machine and its vector instructions, the distributed
  rank and world size, and the global switches that change what gets traced (grad mode,
  autocast, deterministic algorithms, default dtype, matmul precision, SDPA backends).

What it cannot see is a change made at run time to anything but those builders (a module-level
function of the model patched by a test, say): set ``train.compile_cache_dir`` to ``off`` there.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import inspect
import os
import platform
import re
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

FORMAT = "titanpod-step-fingerprint-1"
"""Part of every fingerprint: a change to what it covers starts a new set."""

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def step_fingerprint(
    model: nn.Module,
    config: Any,
    device_type: str,
    decays: Sequence[float],
    flat_inputs: Sequence[Any],
    vector_isa: str,
    builders: Iterable[Callable[..., Any]],
) -> str:
    """A SHA-256 over everything the captured step of ``model`` under ``config`` for ``flat_inputs`` depends on
    (see the module's docstring); ``builders`` are the functions that capture and rewrite the step, as they
    are resolved now."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        for part in parts:
            digest.update(repr(part).encode())
            digest.update(b"\0")

    add(FORMAT, torch.__version__, torch.version.git_version, sys.version_info[:3], platform.machine(), vector_isa)
    add(device_type, _process_switches())
    if device_type == "cuda" and torch.cuda.is_available():
        add(torch.cuda.get_device_capability())
    add(*(describe(builder) for builder in builders))
    add(_source_digest(model))
    add(describe_object(getattr(model, "args", None)), describe_object(getattr(model, "ops", None)))
    add(
        _ADDRESS.sub("", repr(model)), sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()})
    )
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        add(name, _describe_tensor(tensor))
    add(_ADDRESS.sub("", repr(config)), list(decays))
    for value in flat_inputs:
        add(_describe_tensor(value) if isinstance(value, torch.Tensor) else (type(value).__name__, value))
    return digest.hexdigest()


def describe(function: Any, depth: int = 0) -> Any:
    """What a callable computes, the same in every process: a function's module, name and code (its closure
    and defaults described too), a bound method's function and owner's type, any other object by its ``repr``."""
    if depth > MAX_DEPTH:
        return _ADDRESS.sub("", repr(function))
    if isinstance(function, functools.partial):
        parts = (function.func, function.args, function.keywords)
        return ("partial", *(describe_object(part, depth + 1) for part in parts))
    if isinstance(function, types.MethodType):
        return ("method", describe(function.__func__, depth + 1), type(function.__self__).__qualname__)
    if isinstance(function, types.FunctionType):
        cells = [describe_object(cell.cell_contents, depth + 1) for cell in function.__closure__ or () if _filled(cell)]
        return (
            function.__module__,
            function.__qualname__,
            _code_digest(function.__code__),
            describe_object(function.__defaults__, depth + 1),
            cells,
        )
    return describe_object(function, depth)


MAX_DEPTH = 4
"""How deep ``describe`` and ``describe_object`` follow closures, fields and items before settling for ``repr``."""


def describe_object(value: Any, depth: int = 0) -> Any:
    """``value`` as a comparable description: functions by ``describe``, dataclasses field by field, containers
    item by item, anything else by its ``repr`` with memory addresses removed."""
    if depth > MAX_DEPTH:
        return _ADDRESS.sub("", repr(value))
    if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
        return describe(value, depth)
    if isinstance(value, torch.Tensor):
        return _describe_tensor(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: describe_object(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
        return (type(value).__module__, type(value).__qualname__, fields)
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [describe_object(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return sorted((repr(key), describe_object(item, depth + 1)) for key, item in value.items())
    return _ADDRESS.sub("", repr(value))


def _code_digest(code: types.CodeType) -> str:
    """A digest of what ``code`` does (bytecode, constants, names, nested functions), equal in every process
    (``marshal`` output is not: it depends on reference counts)."""
    digest = hashlib.sha256()
    digest.update(code.co_code)
    for const in code.co_consts:
        digest.update((_code_digest(const) if isinstance(const, types.CodeType) else repr(const)).encode() + b"\0")
    parts = (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_argcount, code.co_flags)
    digest.update(repr(parts).encode())
    return digest.hexdigest()


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _describe_tensor(tensor: torch.Tensor) -> tuple[Any, ...]:
    """Shape, strides, dtype, device type and whether it needs gradients; for a DTensor its mesh and placements too."""
    if isinstance(tensor, DTensor):
        mesh = tensor.device_mesh
        groups = [mesh.get_group(dim).group_name for dim in range(mesh.ndim)]
        local = tensor.to_local()
        return (
            "dtensor",
            tuple(tensor.shape),
            tuple(tensor.placements),
            mesh.mesh.tolist(),
            mesh.mesh_dim_names,
            groups,
            _describe_tensor(local),
        )
    return (tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device.type, tensor.requires_grad)


def _process_switches() -> tuple[Any, ...]:
    """The process-wide settings that change what a trace records."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return (
        torch.is_grad_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.is_autocast_enabled("cuda"),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_default_dtype(),
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.flash_sdp_enabled(),
        torch.backends.cuda.mem_efficient_sdp_enabled(),
        torch.backends.cuda.math_sdp_enabled(),
        torch.backends.cuda.cudnn_sdp_enabled(),
        torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
        (torch.distributed.get_rank(), torch.distributed.get_world_size()) if distributed else None,
    )


def _source_digest(model: nn.Module) -> str:
    """The code a capture runs, by content: every source file of titanpod's packages, and the files defining the
    model's module classes and the functions in its op slots (a user's own model or kernel); installed
    libraries it may call by their versions."""
    files = set()
    for root in _namespace_roots():
        files.update(str(path) for path in Path(root).rglob("*.py"))
    ops = getattr(model, "ops", None)
    slots = [getattr(ops, f.name) for f in dataclasses.fields(ops)] if dataclasses.is_dataclass(ops) else []
    for owner in [*{type(module) for module in model.modules()}, *slots]:
        try:
            source = inspect.getsourcefile(owner if isinstance(owner, type) else _unwrapped(owner))
        except TypeError:
            source = None
        if source is not None:
            files.add(os.path.realpath(source))
    digest = hashlib.sha256()
    for path in sorted(files):
        try:
            digest.update(path.encode() + b"\0" + hashlib.sha256(Path(path).read_bytes()).digest())
        except OSError:
            digest.update(path.encode() + b"\0missing")
    for name in LIBRARIES:
        try:
            digest.update(f"{name}={importlib.metadata.version(name)}\0".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{name}=none\0".encode())
    return digest.hexdigest()


LIBRARIES = ("jax", "jaxlib", "torchax", "numpy")
"""Installed libraries whose version a captured step may depend on beside torch (the kernels' JAX bridge)."""


def _namespace_roots() -> list[str]:
    """The folders of titanpod's packages (the ``titanpod`` namespace, one folder per installed package)."""
    namespace = sys.modules[__name__.partition(".")[0]]  # imported already: this module lies in it
    return sorted({os.path.realpath(path) for path in namespace.__path__})


def _unwrapped(function: Any) -> Any:
    """The plain function behind a partial or bound method, or the object's class."""
    while isinstance(function, functools.partial):
        function = function.func
    if isinstance(function, types.MethodType):
        function = function.__func__
    return function if isinstance(function, types.FunctionType) else type(function)
