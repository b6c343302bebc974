"""The captured whole step compiled by inductor as one artifact, kept on disk and reused by the next run.

``torch.compile`` of a captured step traces it again with dynamo before inductor sees it, and
inductor's own caches still leave a second run of the same recipe about 12 s of work at the
debug shape. Here the graph goes to inductor directly (``torch._inductor.standalone_compile``)
and the compiled artifact is saved under a key of everything it depends on: the graph's code
and constants, each input's shape, dtype, strides and device, the torch build, the Python
version and the machine's vector instructions. A later run that captures the same graph loads
it in well under a second.

The cache holds compiled code that is loaded and run, as inductor's own cache does: keep it in
a folder only you write (the default is under your home directory).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

FORMAT = "titanpod-compiled-step-1"
"""Part of every key: a change to how artifacts are made or keyed starts a new set."""


@dataclass(frozen=True)
class CompileReport:
    """How the step's program was obtained."""

    seconds: float
    """Wall time to compile (or load) it; the capture before it is not counted."""
    cache: str
    """``hit`` (loaded from the cache), ``miss`` (compiled and saved) or ``off`` (compiled, no cache)."""
    path: Path | None
    """The artifact's file when the cache is on (on the xla lane: the folder of JAX's cache)."""


def cache_dir_of(setting: str) -> Path | None:
    """The folder ``TrainConfig.compile_cache_dir`` names: ``default`` is ``$XDG_CACHE_HOME/titanpod/compiled-steps``
    (``~/.cache/titanpod/compiled-steps`` without it), ``off`` is none, anything else a path (``~`` expanded)."""
    if setting == "off":
        return None
    if setting == "default":
        root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(root) / "titanpod" / "compiled-steps"
    return Path(setting).expanduser()


def step_key(graph: fx.GraphModule, flat_inputs: list[Any]) -> str:
    """The cache key of ``graph`` compiled for ``flat_inputs``: a SHA-256 over what the compiled code depends on."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        for part in parts:
            digest.update(repr(part).encode())
            digest.update(b"\0")

    add(FORMAT, torch.__version__, torch.version.git_version, sys.version_info[:3], platform.machine())
    add(_vector_isa(), graph.code)
    for value in flat_inputs:
        if isinstance(value, torch.Tensor):
            add(tuple(value.shape), value.stride(), value.dtype, value.device.type, value.requires_grad)
            if value.device.type == "cuda":
                add(torch.cuda.get_device_capability(value.device))
        else:
            add(type(value).__name__, value)
    for name, constant in sorted(_constants(graph).items()):
        add(name, tuple(constant.shape), constant.dtype)
        digest.update(constant.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def compile_step(
    graph: fx.GraphModule, example_inputs: tuple, cache_dir: Path | None
) -> tuple[Callable[..., Any], CompileReport]:
    """``graph`` (a captured step taking ``example_inputs``' structure) compiled by inductor; from ``cache_dir``
    when an artifact of the same key is there, else compiled and saved there (``None``: no cache).

    The returned callable takes and returns what ``graph`` does (nested lists of tensors).
    """
    from torch._inductor import CompiledArtifact, standalone_compile

    started = time.perf_counter()
    flat_inputs = pytree.tree_leaves(example_inputs)
    out_spec = graph.graph._codegen.pytree_info.out_spec  # type: ignore[attr-defined]  # make_fx graphs carry one
    flat = _flat_copy(graph)
    path = cache_dir / f"{step_key(flat, flat_inputs)}.bin" if cache_dir is not None else None
    constants = _lift_constants(flat)
    if path is not None and path.is_file():
        artifact, cache = CompiledArtifact.load(path=str(path), format="binary"), "hit"
    else:
        artifact = standalone_compile(
            flat, [*flat_inputs, *constants], dynamic_shapes="from_example_inputs", donate_graph_module=True
        )
        cache = "off" if path is None else "miss"
        if path is not None:
            try:
                _save_atomically(artifact, path)
            except OSError as error:  # the compile is done: train on, just without keeping it
                warnings.warn(
                    f"The compiled step could not be saved in {path.parent} ({error}); this run goes on, and the "
                    "next one compiles again. Set train.compile_cache_dir to a folder you can write, or 'off'.",
                    stacklevel=2,
                )

    def program(*inputs: Any) -> Any:
        return pytree.tree_unflatten(list(artifact(*pytree.tree_leaves(inputs), *constants)), out_spec)

    return program, CompileReport(time.perf_counter() - started, cache, path)


def _flat_copy(graph: fx.GraphModule) -> fx.GraphModule:
    """``graph`` taking its inputs as one flat list of leaves and returning a flat list of outputs: a freshly
    compiled artifact and a loaded one then return the same thing (the nested form only the first kept)."""
    plain = fx.Graph()
    plain.output(plain.graph_copy(graph.graph, {}))  # nodes and their meta, under fx's plain codegen
    return fx.GraphModule(graph, plain)


def _lift_constants(graph: fx.GraphModule) -> list[torch.Tensor]:
    """Turn the tensors ``graph`` reads as attributes into trailing inputs, in place; returns their values.

    A saved artifact does not keep the constants of the graph it was compiled from, so a loaded
    one is handed them as inputs, exactly as a freshly compiled one is.
    """
    tensors = _constants(graph)
    nodes = [node for node in graph.graph.nodes if node.op == "get_attr" and str(node.target) in tensors]
    values = [tensors[str(node.target)] for node in nodes]
    last_input = [node for node in graph.graph.nodes if node.op == "placeholder"][-1]
    for offset, node in enumerate(nodes):
        with graph.graph.inserting_after(last_input):
            lifted = graph.graph.placeholder(f"constant_{offset}")
        lifted.meta.update(node.meta)
        node.replace_all_uses_with(lifted)
        graph.graph.erase_node(node)
        last_input = lifted
    for target in {str(node.target) for node in nodes}:  # a buffer left behind would be lifted again by inductor
        owner_path, _, name = target.rpartition(".")
        delattr(graph.get_submodule(owner_path) if owner_path else graph, name)
    graph.recompile()
    return values


def _save_atomically(artifact: Any, path: Path) -> None:
    """Write ``artifact`` beside ``path`` and rename it into place, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".partial")
    os.close(handle)
    try:
        artifact.save(path=partial, format="binary")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _constants(graph: fx.GraphModule) -> dict[str, torch.Tensor]:
    """The tensors the graph reads as attributes (constants the capture lifted), by name."""
    found = {}
    for node in graph.graph.nodes:
        if node.op == "get_attr":
            value = graph
            for part in str(node.target).split("."):
                value = getattr(value, part)
            if isinstance(value, torch.Tensor):
                found[str(node.target)] = value
    return found


def _vector_isa() -> str:
    """The CPU vector instructions inductor compiles for on this machine (an artifact for AVX-512 must not load
    where there is only AVX2, as on another host sharing a home directory)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return str(pick_vec_isa())
