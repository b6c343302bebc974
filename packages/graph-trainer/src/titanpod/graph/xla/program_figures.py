"""What the XLA compiler says of a compiled program: memory a device, cost, and the collectives it runs.

Figures are per device: under SPMD every device runs the same partitioned program.
``cost_analysis`` is the compiler's own model: ``optimal_seconds`` is its estimate of the
program's time, not a measurement. Two things it does not see: a ``while`` loop's body counts
once however often it runs (a ``lax.scan``, or the TPU compiler's collective-matmul loops), and
a Pallas kernel counts only the cost it declares (``pl.CostEstimate``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COLLECTIVE_KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
"""The collectives counted, as HLO names them (their asynchronous ``-start``/``-done`` pairs count once)."""

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}  # fmt: skip
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.+?)\s+([\w\-]+)\(")


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes one device holds for the program, from ``compiled.memory_analysis()``."""

    arguments: int
    """Inputs: parameters, optimizer state and the batch (this device's shards)."""
    outputs: int
    """Outputs (the updated state, the loss ...)."""
    aliased: int
    """Output bytes that reuse an argument's buffer (donated state): counted once, in ``arguments``."""
    temporaries: int
    """Everything live only during the program: activations, gradients, gathered parameters, workspace."""
    code: int
    """The compiled program itself."""

    @property
    def total(self) -> int:
        """Peak bytes a device needs: arguments + outputs not aliased to them + temporaries + code."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    def largest(self) -> tuple[str, int]:
        """The biggest part and its bytes (what to shrink first when the program does not fit)."""
        parts = {"arguments (parameters, optimizer state, batch)": self.arguments,
                 "temporaries (activations, gradients, gathered parameters)": self.temporaries,
                 "outputs not aliased to arguments": self.outputs - self.aliased, "code": self.code}  # fmt: skip
        return max(parts.items(), key=lambda item: item[1])


@dataclass(frozen=True)
class Collective:
    """One kind of collective in the optimised program: how many, and the bytes their results hold."""

    count: int
    """Instructions of this kind (an asynchronous start/done pair is one)."""
    bytes: int
    """Bytes of their results on one device, summed (one step, each instruction once)."""


@dataclass(frozen=True)
class ProgramFigures:
    """A compiled program's memory, cost and collectives, per device."""

    memory: DeviceMemory
    """Bytes one device holds."""
    flops: float
    """Floating-point operations one device runs, as the compiler counts them."""
    bytes_accessed: float
    """Bytes one device reads and writes in memory, as the compiler counts them."""
    optimal_seconds: float | None
    """The compiler's estimate of the program's time on the device (TPU only; ``None`` where absent)."""
    collectives: dict[str, Collective] = field(default_factory=dict)
    """Collective kind -> count and bytes, from the optimised HLO (empty when no HLO text was found)."""
    while_loops: int = 0
    """``while`` loops in the optimised HLO: each one's body counts once in ``flops`` and ``optimal_seconds``."""
    loop_sources: tuple[str, ...] = ()
    """Where each loop comes from (its ``op_name``: e.g. a ``searchsorted`` in gmm's tile map, whose few steps
    hide nothing), so a loop that hides real work can be told apart."""

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON, with the memory's total."""
        data = asdict(self)
        data["memory"]["total"] = self.memory.total
        return data


def program_figures(compiled: Any, hlo_text: str | None) -> ProgramFigures:
    """The figures of ``compiled`` (a ``jax.stages.Compiled``); collectives and loops from ``hlo_text``."""
    stats = compiled.memory_analysis()
    memory = DeviceMemory(
        arguments=int(stats.argument_size_in_bytes),
        outputs=int(stats.output_size_in_bytes),
        aliased=int(stats.alias_size_in_bytes),
        temporaries=int(stats.temp_size_in_bytes),
        code=int(stats.generated_code_size_in_bytes),
    )
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # older JAX: one dict per program
    seconds = cost.get("optimal_seconds")
    return ProgramFigures(
        memory=memory,
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        optimal_seconds=None if seconds is None or seconds <= 0 else float(seconds),
        collectives={} if hlo_text is None else collectives_in_hlo(hlo_text),
        while_loops=0 if hlo_text is None else count_while_loops(hlo_text),
        loop_sources=() if hlo_text is None else while_loop_sources(hlo_text),
    )


def optimised_hlo(compiled: Any, dump_dir: Path | None) -> str | None:
    """The optimised HLO text: the ``*after_optimizations.txt`` the compiler dumped into ``dump_dir`` (the entry
    module's, the largest), else ``compiled.as_text()`` (which some jax/libtpu pairs cannot print for a TPU
    executable); ``None`` when neither is there."""
    if dump_dir is not None:
        dumped = sorted(dump_dir.glob("*after_optimizations.txt"), key=lambda path: path.stat().st_size)
        if dumped:
            return dumped[-1].read_text()
    try:
        return compiled.as_text() or None
    except Exception:
        return None


def collectives_in_hlo(text: str) -> dict[str, Collective]:
    """Collective kind -> count and result bytes over every instruction of the HLO module ``text``.

    Synchronous ops count by their result; an asynchronous pair counts once, by its ``-done``'s result. The TPU
    compiler writes a reduce-scatter as an all-reduce inside a computation named ``all-reduce-scatter...``
    (followed by its slice): that counts as a reduce-scatter of the whole buffer.
    """
    counts: dict[str, list[int]] = {kind: [0, 0] for kind in COLLECTIVE_KINDS}
    for computation, result, op in _instructions(text):
        kind = op.removesuffix("-done")
        if kind == "all-reduce" and computation.startswith("all-reduce-scatter"):
            kind = "reduce-scatter"
        if kind not in counts or op.endswith("-start"):
            continue
        counts[kind][0] += 1
        counts[kind][1] += array_bytes(result)
    return {kind: Collective(n, size) for kind, (n, size) in counts.items() if n}


def count_while_loops(text: str) -> int:
    """``while`` instructions in the HLO module ``text``."""
    return len(while_loop_sources(text))


def while_loop_sources(text: str) -> tuple[str, ...]:
    """The ``op_name`` of each ``while`` instruction in the HLO module ``text`` (empty where it has none)."""
    sources = []
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if match and match.group(2) == "while":
            name = _OP_NAME.search(line)
            sources.append(name.group(1) if name else "")
    return tuple(sources)


def array_bytes(shape_text: str) -> int:
    """Bytes of the arrays an HLO result type names (a tuple's elements summed), e.g. ``bf16[8,128]{1,0}``."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape_text):
        numel = 1
        for dim in filter(None, dims.split(",")):
            numel *= int(dim)
        total += numel * _BYTES[dtype]
    return total


def _instructions(text: str) -> Iterable[tuple[str, str, str]]:
    """(computation, result type, op) for every instruction of the module."""
    computation = ""
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header.group(1)
            continue
        match = _INSTRUCTION.match(line)
        if match:
            yield computation, match.group(1), match.group(2)
