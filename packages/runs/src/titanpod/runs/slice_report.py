"""What compiling a recipe's step for a slice found (``SliceCompileReport``): the compiler's figures a chip beside
the dry-run planner's, the rates they imply, which compile gave which figure, and the report written as JSON."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titanpod.graph.xla.ahead_of_time import BatchShape, NamedBatchShape
from titanpod.graph.xla.program_figures import ProgramFigures


@dataclass(frozen=True)
class SliceCompileReport:
    """What compiling a recipe's step for a slice found, per chip unless said otherwise."""

    recipe: str
    """The recipe's name."""
    slice: str
    """The slice compiled for, e.g. ``v5p-8``."""
    chips: int
    """Chips in the job (every slice)."""
    chip_hbm: int
    """HBM a chip, bytes."""
    chip_peak_flops: float
    """The chip's peak dense bf16 FLOP/s."""
    mesh: dict[str, int]
    """Mesh axis -> size (axes of size 1 left out)."""
    batch: BatchShape | NamedBatchShape
    """The step's batch as the program takes it, over the whole mesh."""
    layers: int
    """Transformer layers in the compiled program."""
    model_layers: int
    """Transformer layers of the recipe's model."""
    kernels: dict[str, str]
    """Slot -> kernel (attention, head_loss, expert_matmul)."""
    program: ProgramFigures
    """The compiler's figures for one chip."""
    planner_bytes: int
    """The dry-run planner's estimate of memory a chip."""
    model_flops_per_chip: float
    """The model's training flops a step a chip (6N + attention per token, no recompute; see the README)."""
    tokens_per_step: int
    """Tokens one step trains on over the whole job."""
    trace_seconds: float
    """Wall time to trace and lower the step."""
    compile_seconds: float
    """Wall time of the compiler."""
    peak_host_bytes: int
    """Peak resident memory of this process by the end of the compile."""
    extrapolated_from: tuple[int, ...] = ()
    """The depths compiled when the figures are extrapolated to ``layers`` (linear in depth); empty when the
    program of ``layers`` layers itself was compiled."""
    scanned: bool = False
    """Whether the compiled program ran its blocks as one loop (``train.scan_layers``)."""
    cost_from: tuple[int, ...] = ()
    """When the memory comes from a scanned compile of ``layers`` layers: the depths of the unrolled compiles
    whose flops, bytes, estimated time and collectives are extrapolated to ``layers`` instead (a loop's body
    counts once in the compiler's cost analysis); empty otherwise."""
    cost_compile_seconds: float = 0.0
    """Wall time of the compiles behind ``cost_from`` (0 without them)."""
    images_per_step: int = 0
    """Images one step trains on over the whole job (a diffusion step; 0 for a language model)."""

    @property
    def sources(self) -> dict[str, str]:
        """Which compile gave which figure: ``memory`` and ``cost`` (flops, bytes, time, collectives)."""
        micro_batches = getattr(self.batch, "micro_batches", 1)
        # The micro-batches run as one loop in every compile, whose body the cost analysis counts once.
        once = f"; its loop over the {micro_batches} micro-batches counted once, so low" if micro_batches > 1 else ""
        if self.extrapolated_from:
            depths = " and ".join(map(str, self.extrapolated_from))
            both = f"extrapolated by depth from unrolled compiles of {depths} layers"
            return {"memory": both, "cost": both + once}
        program = f"a compile of {self.layers} layers" + (" (blocks as one loop)" if self.scanned else "")
        if self.cost_from:
            depths = " and ".join(map(str, self.cost_from))
            return {"memory": program, "cost": f"extrapolated by depth from unrolled compiles of {depths} layers{once}"}
        cost = program + (": each loop body counted once, so low" if self.scanned else "") + once
        return {"memory": program, "cost": cost}

    @property
    def fits(self) -> bool:
        """Whether the compiler's peak memory a chip is within the chip's HBM."""
        return self.program.memory.total <= self.chip_hbm

    @property
    def planner_difference(self) -> float:
        """(planner - compiler) / compiler for memory a chip."""
        return (self.planner_bytes - self.program.memory.total) / self.program.memory.total

    @property
    def flops_ratio(self) -> float:
        """The compiler's flops over the model's: above 1 is recompute (about 1.33 with every block recomputed)
        and other work; well below that, some work is hidden from the compiler's count."""
        return self.program.flops / self.model_flops_per_chip

    @property
    def step_seconds(self) -> float | None:
        """The compiler's estimate of a step's time (``optimal_seconds``), an estimate, not a measurement."""
        return self.program.optimal_seconds

    @property
    def tokens_per_second_per_chip(self) -> float | None:
        """Tokens a second a chip at the estimated step time."""
        seconds = self.step_seconds
        return None if seconds is None else self.tokens_per_step / self.chips / seconds

    @property
    def estimated_mfu(self) -> float | None:
        """MFU at the estimated step time: the model's flops a chip over (step time x peak)."""
        seconds = self.step_seconds
        return None if seconds is None else self.model_flops_per_chip / seconds / self.chip_peak_flops

    @property
    def images_per_second_per_chip(self) -> float | None:
        """Images a second a chip at the estimated step time (``None`` for a language model)."""
        seconds = self.step_seconds
        return None if seconds is None or not self.images_per_step else self.images_per_step / self.chips / seconds

    def to_dict(self) -> dict[str, Any]:
        """The report as plain values for JSON, with the derived figures."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["batch"] = dataclasses.asdict(self.batch)
        data["program"] = self.program.to_dict()
        data |= {
            "fits": self.fits,
            "planner_difference": self.planner_difference,
            "flops_ratio": self.flops_ratio,
            "estimated_step_seconds": self.step_seconds,
            "estimated_tokens_per_second_per_chip": self.tokens_per_second_per_chip,
            "estimated_images_per_second_per_chip": self.images_per_second_per_chip,
            "estimated_mfu": self.estimated_mfu,
            "sources": self.sources,
        }
        return data


def write_report(report: SliceCompileReport, path: Path) -> Path:
    """Write the report as JSON to ``path`` (folders made as needed); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return path
