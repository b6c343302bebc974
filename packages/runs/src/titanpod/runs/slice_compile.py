"""``--compile-for SLICE``: a recipe's whole training step compiled by the TPU compiler for a slice, on any host.

The program is the xla lane's step (``titanpod.graph.xla.XlaStep``): the recipe's model
(built on the meta device, no weights), its family's sharding plan on the slice's mesh, its
kernels compiled for the TPU (Pallas through Mosaic, never interpret mode), memory policy,
precision, micro-batches and the AdamW update, all in one ``jax.jit`` program compiled by
libtpu for the slice's abstract devices (``titanpod.device.tpu_slices``). The report sets the
compiler's figures (memory a chip, flops, estimated step time) beside the dry-run planner's.

A recipe with ``train.scan_layers`` compiles its full depth with the blocks as one loop, quickly at any
depth; that compile gives the memory a chip. The compiler's cost analysis counts a loop's body once, so
its flops, bytes, estimated time and collectives come instead from compiles of shallow unrolled copies
(``COST_DEPTHS`` layers), extrapolated by depth (``with_costs_from``); the report names which compile gave
which figure (``SliceCompileReport.sources``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from titanpod.device import CHIPS, get_backend
from titanpod.device.memory import host_memory_stats
from titanpod.device.tpu_slices import TpuSlice, abstract_devices, parse_slice, slice_of
from titanpod.graph import TrainConfig
from titanpod.graph.xla.ahead_of_time import (
    AbstractXlaStep,
    BatchShape,
    NamedBatchShape,
    device_mesh,
    serialized_executable,
)
from titanpod.graph.xla.program_figures import (
    Collective,
    DeviceMemory,
    ProgramFigures,
    optimised_hlo,
    program_figures,
)
from titanpod.kernels import KernelConfig, model_ops
from titanpod.parallel import DATA_AXES
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.families import build_model, sharding_plan
from titanpod.recipes.planner.plan import plan_run
from titanpod.recipes.recipe import Recipe

COST_MODEL_OPTIONS = {
    "xla_tpu_enable_windowed_einsum_for_all_gather": False,
    "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False,
    "xla_tpu_sliced_prefetch_max_slices": 0,
}
"""libtpu options that keep the cost analysis honest. The first two keep the compiler from turning gathers and
reductions next to matmuls into ``while`` loops, whose bodies count once. The third keeps it from copying a
buffer into VMEM in slices joined by a ``ConcatBitcast``, which libtpu 0.0.52's cost model prices at -1 s each
(on v6e a whole step's estimate came out negative); whole copies instead raise the estimate by 0.1% (Llama 3 8B
on v6e-256) to 5% (the debug model), and change nothing on v5p."""

COST_DEPTHS = (2, 4)
"""The depths of the unrolled copies whose compiles give a scanned program's flops, time and collectives."""


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
        if self.extrapolated_from:
            depths = " and ".join(map(str, self.extrapolated_from))
            both = f"extrapolated by depth from unrolled compiles of {depths} layers"
            return {"memory": both, "cost": both}
        program = f"a compile of {self.layers} layers" + (" (blocks as one loop)" if self.scanned else "")
        if self.cost_from:
            depths = " and ".join(map(str, self.cost_from))
            return {"memory": program, "cost": f"extrapolated by depth from unrolled compiles of {depths} layers"}
        cost = program + (": each loop body counted once, so low" if self.scanned else "")
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


def target_slice(recipe: Recipe | DiffusionRecipe, name: str) -> TpuSlice:
    """The slice ``--compile-for`` names: ``target`` is the recipe's own (``target.chip`` x ``target.chips``)."""
    if name == "target":
        return slice_of(recipe.target.chip, recipe.target.chips)
    return parse_slice(name)


def for_tpu(recipe: Recipe, layers: int | None = None) -> Recipe:
    """The recipe as the pod runs it: its Pallas kernels compiled (never interpret mode), no step cache, and
    the model cut to ``layers`` transformer layers when given (then unrolled: those compiles are for the
    cost analysis, which counts a loop's body once)."""
    kernels = compiled_kernels(recipe.kernels)
    model = recipe.model
    if layers is not None:
        model = dataclasses.replace(model, shape=dataclasses.replace(model.shape, n_layers=layers))
    train = dataclasses.replace(recipe.train, compile_cache_dir="off")
    if layers is not None:
        train = dataclasses.replace(train, scan_layers=False)
    return dataclasses.replace(recipe, kernels=kernels, model=model, train=train)


@dataclass
class SliceProgram:
    """A recipe's training step ready to compile for a slice, and the figures its report sets beside the
    compiler's: what ``compile_program`` takes, built by each runner's kind of recipe (``compile_for_slice`` for
    the decoder LLMs, ``titanpod.runs.diffusion.slice_compile`` for FLUX)."""

    recipe: str
    """The recipe's name."""
    model: nn.Module
    """What the step trains (its ``loss`` is the step's loss), on the meta device: no weights."""
    plan: Any
    """The family's sharding plan (``titanpod.parallel.ShardingPlan``)."""
    train: TrainConfig
    """The step's settings as the pod runs them (``for_tpu``)."""
    axes: dict[str, int]
    """Mesh axis -> size over the slice's devices (every axis, size 1 too)."""
    gather_dtype: torch.dtype
    """The dtype FSDP gathers parameters in (``parallel.param_dtype``)."""
    batch: BatchShape | NamedBatchShape
    """The step's batch as the program takes it, over the whole mesh."""
    kernels: dict[str, str]
    """Slot -> kernel."""
    layers: int
    """Transformer blocks in the program."""
    model_layers: int
    """Transformer blocks of the recipe's model."""
    model_flops_per_chip: float
    """The model's training flops a step a chip (no recompute)."""
    tokens_per_step: int
    """Tokens one step trains on over the whole job."""
    planner_bytes: int
    """The dry-run planner's estimate of the step's memory a chip."""
    batch_text: str
    """The batch in words, for the table and the first line."""
    images_per_step: int = 0
    """Images one step trains on over the whole job (0 for a language model)."""


def compile_program(
    program: SliceProgram, tpu: TpuSlice, *, dump_dir: Path | None = None, say: Any = print
) -> tuple[SliceCompileReport, Any]:
    """Compile ``program``'s step for ``tpu`` with libtpu and report on it; also returns the ``jax.stages.Compiled``.

    ``dump_dir`` keeps the compiler's HLO there (a temporary folder otherwise, for the collectives).
    """
    chip = CHIPS[tpu.chip]
    devices = abstract_devices(tpu)
    split = {axis: size for axis, size in program.axes.items() if size > 1} or {"fsdp": 1}
    mesh = device_mesh(devices, split)
    say(
        f"compiling {program.recipe} ({program.layers} of {program.model_layers} layers) for {tpu.name}: mesh "
        + " x ".join(f"{axis} {size}" for axis, size in split.items())
        + f", batch {program.batch_text}"
    )
    backend = get_backend("xla")
    step = AbstractXlaStep(
        program.model, program.train, backend, program.plan, program.axes, mesh, program.gather_dtype
    )
    with tempfile.TemporaryDirectory(prefix="titanpod-hlo-") as scratch:
        folder = dump_dir or Path(scratch)
        compiled_step = step.compile(program.batch, folder, COST_MODEL_OPTIONS)
        figures = program_figures(compiled_step.compiled, optimised_hlo(compiled_step.compiled, folder))
    report = SliceCompileReport(
        recipe=program.recipe,
        slice=tpu.name,
        chips=tpu.total_chips,
        chip_hbm=chip.memory_bytes,
        chip_peak_flops=chip.peak_flops,
        mesh=split,
        batch=program.batch,
        layers=program.layers,
        model_layers=program.model_layers,
        kernels=program.kernels,
        program=figures,
        planner_bytes=program.planner_bytes,
        model_flops_per_chip=program.model_flops_per_chip,
        tokens_per_step=program.tokens_per_step,
        trace_seconds=compiled_step.trace_seconds,
        compile_seconds=compiled_step.compile_seconds,
        peak_host_bytes=host_memory_stats().peak_bytes or 0,
        scanned=step.layer_stack.stacks_any,
        images_per_step=program.images_per_step,
    )
    return report, compiled_step.compiled


def compiled_kernels(kernels: KernelConfig) -> KernelConfig:
    """``kernels`` with every Pallas kernel compiled by Mosaic for the TPU (interpret mode off)."""
    return dataclasses.replace(
        kernels,
        splash=dataclasses.replace(kernels.splash, interpret=False),
        grouped_matmul=dataclasses.replace(kernels.grouped_matmul, interpret=False),
        pallas_loss=dataclasses.replace(kernels.pallas_loss, interpret=False),
    )


def compile_for_slice(
    recipe: Recipe, tpu: TpuSlice, *, layers: int | None = None, dump_dir: Path | None = None, say: Any = print
) -> tuple[SliceCompileReport, Any]:
    """Compile ``recipe``'s step for ``tpu`` and report on it; also returns the ``jax.stages.Compiled``.

    ``layers`` compiles the model cut to that many layers (a quick look; the full depth is the default).
    ``dump_dir`` keeps the compiler's HLO there (a temporary folder otherwise, for the collectives).
    """
    return compile_program(llm_program(recipe, tpu, layers), tpu, dump_dir=dump_dir, say=say)


def llm_program(recipe: Recipe, tpu: TpuSlice, layers: int | None = None) -> SliceProgram:
    """A decoder LLM recipe's step as the pod runs it on ``tpu``, cut to ``layers`` layers when given."""
    if recipe.parallel.pp > 1:
        raise ValueError(
            f"{recipe.name} runs pipeline stages (parallel.pp={recipe.parallel.pp}), which run as eager steps, "
            "not as one compiled program; --compile-for compiles the whole step of a recipe without pipelining."
        )
    chip = CHIPS[tpu.chip]
    full_depth = recipe.model.args().n_layers
    pod = for_tpu(recipe, layers)
    axes = pod.parallel.mesh_axes(tpu.total_chips * chip.devices_per_chip)
    data_ranks = math.prod(axes[axis] for axis in DATA_AXES)
    shape = BatchShape(
        micro_batches=pod.train.grad_accum_steps,
        batch=pod.data.batch_size * data_ranks,
        seq_len=pod.data.seq_len,
        documents=pod.data.document_masking,
    )
    model = build_model(pod.model.family, pod.model.args(), model_ops(pod.kernels))
    tokens = shape.micro_batches * shape.batch * shape.seq_len
    on_xla = dataclasses.replace(pod, device=dataclasses.replace(pod.device, lane="xla"))  # the step compiled here
    planned = plan_run(on_xla, chip, tpu.total_chips, pod.target.mfu)
    return SliceProgram(
        recipe=recipe.name,
        model=model,
        plan=sharding_plan(pod.model.family),
        train=pod.train,
        axes=axes,
        gather_dtype=getattr(torch, pod.parallel.param_dtype),  # as the pretraining runner builds the step
        batch=shape,
        kernels={slot: getattr(pod.kernels, slot) for slot in ("attention", "head_loss", "expert_matmul")},
        layers=model.args.n_layers,
        model_layers=full_depth,
        model_flops_per_chip=model.flops_per_token(shape.seq_len) * tokens / math.prod(axes.values()),
        tokens_per_step=tokens,
        planner_bytes=planned.memory.total,
        batch_text=f"{shape.micro_batches} x {shape.batch} x {shape.seq_len}",
    )


def with_costs_from(
    full: SliceCompileReport, shallow: SliceCompileReport, deeper: SliceCompileReport
) -> SliceCompileReport:
    """``full`` (a scanned compile of the whole depth) with its flops, bytes, estimated time and collectives
    replaced by those ``extrapolated`` from two unrolled compiles of shallow copies; memory, loops and compile
    time stay ``full``'s own."""
    cost = extrapolated(shallow, deeper).program
    program = dataclasses.replace(
        cost, memory=full.program.memory, while_loops=full.program.while_loops, loop_sources=full.program.loop_sources
    )
    return dataclasses.replace(
        full,
        program=program,
        cost_from=(shallow.layers, deeper.layers),
        cost_compile_seconds=shallow.compile_seconds
        + shallow.trace_seconds
        + deeper.compile_seconds
        + deeper.trace_seconds,
        peak_host_bytes=max(full.peak_host_bytes, shallow.peak_host_bytes, deeper.peak_host_bytes),
    )


def extrapolated(shallow: SliceCompileReport, deeper: SliceCompileReport) -> SliceCompileReport:
    """The full model's figures from two compiles of shallow copies (``deeper`` with more layers): every memory
    part, flop, byte, second and collective grows linearly with depth, as identical layers make it. Compile time
    and host memory are the two compiles' own (summed, and the larger)."""
    if deeper.layers <= shallow.layers:
        raise ValueError("Extrapolating by depth needs two compiles of different depths, the second deeper.")
    depth = shallow.model_layers
    scale = (depth - shallow.layers) / (deeper.layers - shallow.layers)

    def grow(low: float, high: float) -> float:
        return low + (high - low) * scale

    a, b = shallow.program, deeper.program
    memory = DeviceMemory(*(round(grow(getattr(a.memory, f.name), getattr(b.memory, f.name)))
                            for f in dataclasses.fields(DeviceMemory)))  # fmt: skip
    collectives = {
        kind: Collective(
            round(grow(a.collectives.get(kind, Collective(0, 0)).count, b.collectives[kind].count)),
            round(grow(a.collectives.get(kind, Collective(0, 0)).bytes, b.collectives[kind].bytes)),
        )
        for kind in b.collectives
    }
    seconds = (
        None if a.optimal_seconds is None or b.optimal_seconds is None else grow(a.optimal_seconds, b.optimal_seconds)
    )
    program = ProgramFigures(
        memory, grow(a.flops, b.flops), grow(a.bytes_accessed, b.bytes_accessed), seconds, collectives,
        b.while_loops, b.loop_sources,
    )  # fmt: skip
    return dataclasses.replace(
        deeper,
        layers=depth,
        program=program,
        model_flops_per_chip=grow(shallow.model_flops_per_chip, deeper.model_flops_per_chip),
        planner_bytes=round(grow(shallow.planner_bytes, deeper.planner_bytes)),
        trace_seconds=shallow.trace_seconds + deeper.trace_seconds,
        compile_seconds=shallow.compile_seconds + deeper.compile_seconds,
        peak_host_bytes=max(shallow.peak_host_bytes, deeper.peak_host_bytes),
        extrapolated_from=(shallow.layers, deeper.layers),
    )


def write_report(report: SliceCompileReport, path: Path) -> Path:
    """Write the report as JSON to ``path`` (folders made as needed); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return path


def save_executable(compiled: Any, path: Path) -> Path | None:
    """The compiled program, serialised by JAX, to ``path``; ``None`` (with a note) where JAX cannot."""
    try:
        payload = serialized_executable(compiled)
    except Exception as error:
        print(f"the executable could not be serialised: {error}", file=sys.stderr)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path
