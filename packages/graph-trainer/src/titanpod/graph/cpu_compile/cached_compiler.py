"""``CachedStepCompiler``: the whole step compiled once into the compiled-step cache and loaded from it later."""

from __future__ import annotations

from pathlib import Path

from torch import fx
from torch.utils import _pytree as pytree

from titanpod.graph.cpu_compile.compiled_steps import compile_step, load_shortcut
from titanpod.graph.cpu_compile.step_fingerprint import step_fingerprint
from titanpod.graph.cpu_compile.torch_release import check_torch_release
from titanpod.graph.cpu_compile.vector_isa import VectorIsaProbe
from titanpod.graph.fused_adamw import fused_adamw_op
from titanpod.graph.step_compiler import CompileReport, Program, StepCompiler, StepSource


class CachedStepCompiler(StepCompiler):
    """Compiles a captured step with ``torch._inductor.standalone_compile`` into ``cache_dir`` (``None``: no cache),
    and loads a step a run before this one saved there under the step's fingerprint, without capturing it.

    On the CPU the check of inductor's vector instructions starts at construction, so it overlaps whatever
    comes before the first step and the capture.
    """

    def __init__(self, source: StepSource, cache_dir: Path | None) -> None:
        check_torch_release()
        self._source = source
        self._cache_dir = cache_dir
        self._vector_isa = VectorIsaProbe(cache_dir) if source.device_type == "cpu" else None
        self._fingerprint: str | None = None  # of the inputs the last load looked for, for the compile after it

    def load(self, inputs: tuple) -> tuple[Program, CompileReport] | None:
        """The step saved under its fingerprint by an earlier run; ``None`` when there is none, the cache is off,
        or this machine's vector instructions were never checked (the first process on a machine captures at
        once, while the check runs, instead of waiting seconds for a fingerprint no shortcut is saved under)."""
        self._fingerprint = None
        if not self.shortcut_possible():
            return None
        fingerprint = self.fingerprint(inputs)
        fused_adamw_op()  # the one custom op of titanpod's own a step may call, registered as its capture would
        loaded = load_shortcut(self._cache_dir, fingerprint)
        if loaded is None:
            self._fingerprint = fingerprint
        return loaded

    def compile(self, graph: fx.GraphModule, inputs: tuple) -> tuple[Program, CompileReport]:
        """``graph`` compiled (or its artifact loaded from the cache), with a shortcut saved under the step's
        fingerprint (the one the last ``load`` looked for, else worked out now, after the capture it overlaps)."""
        fingerprint, self._fingerprint = self._fingerprint, None
        if fingerprint is None and self._cache_dir is not None:
            fingerprint = self.fingerprint(inputs)
        return compile_step(
            graph,
            inputs,
            self._cache_dir,
            vector_isa=self._vector_isa.result if self._vector_isa is not None else None,
            fingerprint=fingerprint,
        )

    def shortcut_possible(self) -> bool:
        """Whether a run before this one can have left a shortcut: the cache is on and, on the CPU, this machine's
        vector instructions were checked before."""
        if self._cache_dir is None:
            return False
        return self._vector_isa is None or not self._vector_isa.runs_check()

    def fingerprint(self, inputs: tuple) -> str:
        """The key of the step taking ``inputs``, before any capture: what its graph is made from, and the
        functions that make it (``step_fingerprint``)."""
        source = self._source
        isa = self._vector_isa.result() if self._vector_isa is not None else ""
        leaves, structure = pytree.tree_flatten(inputs)  # the structure holds a named batch's names
        return step_fingerprint(
            source.model,
            source.config,
            source.device_type,
            source.decays,
            [*leaves, str(structure)],
            isa,
            source.builders,
        )
