"""The captured whole step compiled by inductor as one artifact, kept on disk and reused by the next run.

``torch.compile`` of a captured step traces it again with dynamo before inductor sees it, and
inductor's own caches still leave a second run of the same recipe about 12 s of work at the
debug shape. Here the graph goes to inductor directly (``torch._inductor.standalone_compile``)
and the compiled artifact is saved under a key of everything it depends on: the graph's code
and constants, each input's shape, dtype, strides and device, the torch build, the Python
version and the machine's vector instructions. A later run that captures the same graph loads
it in well under a second.

A later run of the same recipe need not even capture it: beside each artifact the cache keeps a
shortcut under the step's fingerprint (``titanpod.graph.cpu_compile.step_fingerprint``: the code, model,
config and inputs the graph is made from), with what calling the artifact needs and the capture
alone would tell (the folded constants and the outputs' structure). ``load_shortcut`` finds it.

Inductor's pick of vector instructions, part of every key, comes from
``titanpod.graph.cpu_compile.vector_isa.VectorIsaProbe``, which works it out while the step is captured.

The cache holds compiled code that is loaded and run, as inductor's own cache does: keep it in
a folder only you write (the default is under your home directory).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from titanpod.graph.cpu_compile.early_kernel_builds import kernels_built_as_generated
from titanpod.graph.step_compiler import CompileReport

FORMAT = "titanpod-compiled-step-1"
"""Part of every key: a change to how artifacts are made or keyed starts a new set."""

SHORTCUT_FORMAT = "titanpod-step-shortcut-1"
"""Written in every shortcut file; one of another format is ignored."""

CPU_OPTIONS: dict[str, Any] = {"realize_reads_threshold": 1}
"""Inductor settings for a step whose inputs are all on the CPU (part of its key).

``realize_reads_threshold``: a value read by several consumers is written to memory once computing it reads more
than one buffer (inductor's default is four). The residual stream is then stored once per layer rather than summed
again, in each norm that reads it, from every earlier layer's outputs; so every layer's norm kernels are the same
and inductor compiles each once. At the anchors' shape (6 layers) that is 17 C++ kernels instead of 26 and about
5 s less of a cold compile on 2 cores, with steps no slower (``tools/bench/compile_time.py``)."""


def step_key(
    graph: fx.GraphModule, flat_inputs: list[Any], vector_isa: str | None = None, options: dict[str, Any] | None = None
) -> str:
    """The cache key of ``graph`` compiled for ``flat_inputs``: a SHA-256 over what the compiled code depends on
    (``vector_isa``: inductor's pick for this CPU, probed here when not given; ``options``: the inductor settings
    it is compiled with, ``inductor_options(flat_inputs)`` when not given)."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        for part in parts:
            digest.update(repr(part).encode())
            digest.update(b"\0")

    add(FORMAT, torch.__version__, torch.version.git_version, sys.version_info[:3], platform.machine())
    add(vector_isa if vector_isa is not None else _vector_isa(), graph.code)
    add(sorted((options if options is not None else inductor_options(flat_inputs)).items()))
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
    graph: fx.GraphModule,
    example_inputs: tuple,
    cache_dir: Path | None,
    vector_isa: Callable[[], str] | None = None,
    fingerprint: str | None = None,
) -> tuple[Callable[..., Any], CompileReport]:
    """``graph`` (a captured step taking ``example_inputs``' structure) compiled by inductor; from ``cache_dir``
    when an artifact of the same key is there, else compiled and saved there (``None``: no cache).

    ``vector_isa`` gives inductor's pick of vector instructions (``VectorIsaProbe.result`` of
    ``titanpod.graph.cpu_compile.vector_isa``; inductor's own check is run here when not given). With
    ``fingerprint`` (``titanpod.graph.cpu_compile.step_fingerprint``) a shortcut to the artifact is saved under
    it, for ``load_shortcut`` to find without a capture. The returned callable takes and returns what ``graph``
    does (nested lists of tensors).
    """
    from torch._inductor import CompiledArtifact, standalone_compile

    started = time.perf_counter()
    flat_inputs = pytree.tree_leaves(example_inputs)
    out_spec = graph.graph._codegen.pytree_info.out_spec  # type: ignore[attr-defined]  # make_fx graphs carry one
    flat = _flat_copy(graph)
    isa = vector_isa() if vector_isa is not None else _vector_isa()
    options = inductor_options(flat_inputs)
    path = cache_dir / f"{step_key(flat, flat_inputs, isa, options)}.bin" if cache_dir is not None else None
    constants = _lift_constants(flat)
    if path is not None and path.is_file():
        artifact, cache = CompiledArtifact.load(path=str(path), format="binary"), "hit"
    else:
        with kernels_built_as_generated():
            artifact = standalone_compile(
                flat,
                [*flat_inputs, *constants],
                dynamic_shapes="from_example_inputs",
                options={"config_patches": options},
                donate_graph_module=True,
            )
        cache = "miss"
        saved = path is not None and _warn_unsaved(
            path.parent, lambda: save_atomically(lambda partial: artifact.save(path=partial, format="binary"), path)
        )
        if not saved:  # compiled, and kept nowhere
            cache, path = "off", None
    if path is not None and fingerprint is not None and path.is_file():
        ops = _custom_ops(flat)
        _warn_unsaved(path.parent, lambda: _save_shortcut(path, fingerprint, constants, out_spec, ops))
    return _program(artifact, constants, out_spec), CompileReport(time.perf_counter() - started, cache, path)


def inductor_options(flat_inputs: list[Any]) -> dict[str, Any]:
    """The inductor settings a step taking ``flat_inputs`` is compiled with: ``CPU_OPTIONS`` when every tensor among
    them is on the CPU, else inductor's defaults."""
    devices = {value.device.type for value in flat_inputs if isinstance(value, torch.Tensor)}
    return dict(CPU_OPTIONS) if devices == {"cpu"} else {}


def load_shortcut(cache_dir: Path, fingerprint: str) -> tuple[Callable[..., Any], CompileReport] | None:
    """The compiled step that ``compile_step`` saved a shortcut to under ``fingerprint``, loaded without its
    graph; ``None`` when there is none (or it, or its artifact, cannot be read: the caller captures instead)."""
    record_path = cache_dir / f"{fingerprint}.shortcut.json"
    if not record_path.is_file():
        return None
    started = time.perf_counter()
    try:
        record = json.loads(record_path.read_text())
        if record.get("format") != SHORTCUT_FORMAT:
            return None
        path = cache_dir / record["artifact"]
        constants = torch.load(cache_dir / record["constants"], weights_only=True) if record["constants"] else []
        if not path.is_file() or not isinstance(constants, list) or len(constants) != len(record["devices"]):
            return None
        if not all(_registered(op) for op in record["ops"]):  # a kernel registered by its capture: capture
            return None
        constants = [c.to(device) for c, device in zip(constants, record["devices"], strict=True)]
        out_spec = pytree.treespec_loads(record["out_spec"])
        from torch._inductor import CompiledArtifact

        artifact = CompiledArtifact.load(path=str(path), format="binary")
    except Exception as error:  # any failure here only costs the capture it would have saved
        warnings.warn(
            f"The compiled-step shortcut {record_path} could not be read ({error}); capturing the step.", stacklevel=2
        )
        return None
    return _program(artifact, constants, out_spec), CompileReport(time.perf_counter() - started, "hit", path)


def _program(artifact: Any, constants: list[torch.Tensor], out_spec: Any) -> Callable[..., Any]:
    def program(*inputs: Any) -> Any:
        return pytree.tree_unflatten(list(artifact(*pytree.tree_leaves(inputs), *constants)), out_spec)

    return program


def _warn_unsaved(folder: Path, save: Callable[[], None]) -> bool:
    """Run ``save``; whether it wrote. A failure to write warns (the compile is done: train on, just without
    keeping it)."""
    try:
        save()
        return True
    except OSError as error:
        warnings.warn(
            f"The compiled step could not be saved in {folder} ({error}); this run goes on, and the "
            "next one compiles again. Set train.compile_cache_dir to a folder you can write, or 'off'.",
            stacklevel=3,
        )
        return False


def _save_shortcut(
    artifact_path: Path, fingerprint: str, constants: list[torch.Tensor], out_spec: Any, ops: list[str]
) -> None:
    """Write the record ``load_shortcut`` reads: the artifact's name, the outputs' structure, the constants and
    the custom ops the step calls (which must be registered before it runs)."""
    folder = artifact_path.parent
    constants_name = f"{fingerprint}.constants.pt" if constants else ""
    if constants:
        save_atomically(
            lambda partial: torch.save([c.detach().cpu() for c in constants], partial), folder / constants_name
        )
    record = {
        "format": SHORTCUT_FORMAT,
        "artifact": artifact_path.name,
        "constants": constants_name,
        "devices": [str(c.device) for c in constants],
        "ops": ops,
        "out_spec": pytree.treespec_dumps(out_spec),
    }
    save_atomically(
        lambda partial: Path(partial).write_text(json.dumps(record)), folder / f"{fingerprint}.shortcut.json"
    )


BUILTIN_OP_NAMESPACES = frozenset({"aten", "prims", "_c10d_functional", "c10d_functional", "_dtensor", "inductor"})
"""Namespaces of ops torch registers itself; any other op a step calls was registered by a library or a kernel."""


def _custom_ops(graph: fx.GraphModule) -> list[str]:
    """The qualified names (``namespace::name.overload``) of the ops in ``graph`` that torch does not register."""
    names = set()
    for node in graph.graph.nodes:
        target = node.target
        custom = isinstance(target, torch._ops.OpOverload) and target.namespace not in BUILTIN_OP_NAMESPACES
        if node.op == "call_function" and custom:
            names.add(f"{target.namespace}::{target._opname}.{target._overloadname}")
    return sorted(names)


def _registered(qualified: str) -> bool:
    """Whether the op ``namespace::name.overload`` is registered in this process."""
    namespace, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    try:
        getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        return False
    return True


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


def save_atomically(write: Callable[[str], Any], path: Path) -> None:
    """Write a file beside ``path`` with ``write(partial_path)`` and rename it into place, so a reader never
    sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".partial")
    os.close(handle)
    try:
        write(partial)
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
