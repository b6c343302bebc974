"""The dry run of a FLUX diffusion recipe: parameters, FLOPs per sample, memory per device, step time.

Legend: B batch, L image tokens, T text tokens, S = T + L, M model width, D head dim.

Every transformer parameter is sharded by the FLUX plan (FSDP over all devices; fp32 masters,
gradients and two AdamW moments). Activations come from one double-stream and one single-stream block run
on meta tensors with this device's micro-batch (see ``activations.py``): all they save, or only
their inputs when blocks are recomputed (``blocks_recomputed``). Attention is planned as a flash-style
kernel, except the reference on the xla lane, whose score matrices a block's backward holds
(``materialises_scores``). The frozen encoders
(T5-XXL, CLIP-L, the autoencoder) sit on every device in bf16 unless their outputs are cached.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from rich.table import Table

from titanpod.device import ChipSpec, backend_class
from titanpod.models import parameter_count
from titanpod.models.flux import FluxArgs, FluxOps, build_flux_transformer
from titanpod.models.flux.layers import axes_rotary_cos_sin
from titanpod.parallel import DATA_AXES
from titanpod.recipes.diffusion.recipe import RANDOM_TEXT_ENCODERS, DiffusionRecipe
from titanpod.recipes.families import sharding_plan
from titanpod.recipes.layout_support import check_layout
from titanpod.recipes.planner.activations import flash_attention_stand_in, measure_saved_bytes
from titanpod.recipes.planner.host import HostMemoryPlan, plan_host_memory, planned_lane
from titanpod.recipes.planner.host_table import add_host_row
from titanpod.recipes.planner.lane_traits import runs_one_jitted_program
from titanpod.recipes.planner.plan import FIT_FRACTION, MemoryPlan

FROZEN_ENCODER_PARAMETERS = {"t5": 4_762_310_656, "clip": 123_060_480, "autoencoder": 83_819_683}
"""Published sizes of FLUX.1's frozen models: the T5 v1.1 XXL encoder, the CLIP ViT-L/14 text model
and the FLUX autoencoder (its count is the flavor ``flux`` built here)."""

T5_TOKENS = 512
"""Text tokens per prompt for FLUX.1-dev (schnell uses 256)."""


@dataclass(frozen=True)
class FluxRunPlan:
    """What the dry run works out for one diffusion recipe on one slice."""

    recipe: str
    """Recipe name."""
    flavor: str
    """Transformer flavor."""
    parameters: int
    """Transformer parameters."""
    flops_per_sample: float
    """Training FLOPs per image (forward and backward)."""
    image_tokens: int
    """Image tokens per sample."""
    text_tokens: int
    """Text tokens per sample."""
    chip: ChipSpec
    """The device planned for."""
    devices: int
    """Devices in the slice."""
    batch_per_device: int
    """Images in one micro-batch on each data rank (the tp ranks of a data rank share its images)."""
    memory: MemoryPlan
    """Predicted bytes per device."""
    frozen_encoders: int
    """Bytes of the frozen encoders on each device (0 with an encodings cache)."""
    target_mfu: float
    """MFU the step time is worked out for."""
    host: HostMemoryPlan | None = None
    """Predicted host memory per process and per worker VM (``None`` on the cpu lane)."""
    mesh: dict[str, int] = field(default_factory=dict)
    """Mesh axis -> size (``ParallelConfig.mesh_axes``); empty reads as ``fsdp`` over every device."""

    @property
    def data_ranks(self) -> int:
        """Devices that read their own images: all of them but for tensor parallelism."""
        return math.prod(self.mesh.get(axis, 1) for axis in DATA_AXES) if self.mesh else self.devices

    @property
    def total_bytes(self) -> int:
        """Predicted peak bytes per device, encoders included."""
        return self.memory.total + self.frozen_encoders

    @property
    def device_fits(self) -> bool:
        """Whether the plan leaves the runtime its share of device memory."""
        return self.total_bytes <= FIT_FRACTION * self.chip.memory_bytes

    @property
    def fits(self) -> bool:
        """Whether the device fits and the worker VM does too (where its memory is known)."""
        return self.device_fits and (self.host is None or self.host.fits is not False)

    @property
    def step_seconds(self) -> float:
        """Seconds per step at ``target_mfu``."""
        samples = self.batch_per_device * self.data_ranks
        return self.flops_per_sample * samples / (self.devices * self.chip.peak_flops * self.target_mfu)


REFERENCE_SCORE_ARRAYS = 4
"""[B, H, S, S] arrays in the compute dtype that one block's backward holds at once when attention is the
reference (scores, probabilities and the gradients of both): fitted to libtpu's figure for flux1_12b on the xla
lane (3.6 GiB above the flash-attention plan, 3.7 such arrays), not derived."""


def flux_attention_kernel(recipe: DiffusionRecipe) -> str:
    """The attention a FLUX recipe's transformer runs: ``kernels.attention`` (``sdpa``, the PyTorch reference, or
    ``splash``)."""
    return recipe.kernels.attention


def materialises_scores(recipe: DiffusionRecipe, lane: str) -> bool:
    """Whether the run's attention builds the whole [B, H, S, S] score matrix: the reference in a lane's jitted step
    (the xla lane's), which torchax runs as plain matmuls and a softmax (the torch lanes' SDPA is flash-style, as
    Splash is)."""
    return runs_one_jitted_program(lane) and flux_attention_kernel(recipe) != "splash"


def blocks_recomputed(recipe: DiffusionRecipe) -> bool:
    """Whether the run keeps only each block's inputs: ``model.recompute_blocks`` (eager and per_block steps), or
    the whole step's ``train.memory_policy`` ``recompute`` or ``offload``. ``selective`` is planned as ``save``,
    an upper bound."""
    return recipe.model.recompute_blocks or recipe.train.memory_policy in ("recompute", "offload")


@dataclass(frozen=True)
class FluxSampleShape:
    """What one training sample of a diffusion recipe is to its transformer."""

    latent_channels: int
    """Channels of the codec's latents (3 for pixels, 16 for the FLUX autoencoder); a token packs 2 x 2."""
    image_tokens: int
    """L: image tokens (2 x 2 latent patches)."""
    text_tokens: int
    """T: text tokens (T5's, padded to its length)."""


def flux_sample_shape(recipe: DiffusionRecipe) -> FluxSampleShape:
    """The tokens of one sample of ``recipe``: pixels or the autoencoder's 16 latent channels at an eighth of the
    side, and T5's 512 tokens (the tiny random encoders' own lengths)."""
    pixels = recipe.model.autoencoder == "pixels"
    latent_side = recipe.data.resolution // (1 if pixels else 8)
    text_tokens = RANDOM_TEXT_ENCODERS.get(recipe.model.text_encoders, T5_TOKENS)
    return FluxSampleShape(3 if pixels else 16, (latent_side // 2) ** 2, text_tokens)


def plan_flux(
    recipe: DiffusionRecipe, chip: ChipSpec, chips: int, target_mfu: float, args: FluxArgs | None = None
) -> FluxRunPlan:
    """Plan ``recipe`` on ``chips`` chips of kind ``chip``; ``PlanError`` for a layout diffusion runs do not take.

    ``args``: the transformer's shape when not the recipe flavor's (e.g. a copy cut to fewer blocks)."""
    lane = planned_lane(recipe.device.lane, chip)
    check_layout("diffusion", lane, backend_class(lane), recipe.parallel, recipe.train)  # as the runner will
    devices = chips * chip.devices_per_chip
    sample = flux_sample_shape(recipe)
    if args is None:
        args = recipe.model.args()
    args = dataclasses.replace(args, in_channels=sample.latent_channels * 4)
    image_tokens, text_tokens = sample.image_tokens, sample.text_tokens
    model = build_flux_transformer(args, FluxOps(attention=flash_attention_stand_in))
    parameters = parameter_count(model)
    dtype = torch.bfloat16 if recipe.train.precision == "bf16" else torch.float32
    B = recipe.data.batch_size
    with torch.device("meta"):
        double, single = model.double_blocks[0].to(dtype), model.single_blocks[0].to(dtype)
        img = torch.empty(B, image_tokens, args.dim, dtype=dtype, requires_grad=True)
        txt = torch.empty(B, text_tokens, args.dim, dtype=dtype, requires_grad=True)
        joint = torch.empty(B, text_tokens + image_tokens, args.dim, dtype=dtype, requires_grad=True)
        vec = torch.empty(B, args.dim, dtype=dtype, requires_grad=True)
        ids = torch.zeros(text_tokens + image_tokens, 3)
        cos, sin = axes_rotary_cos_sin(ids, args.axes_dims, args.rope_theta)
    saved_double = measure_saved_bytes(double, lambda: double(img, txt, vec, cos, sin), img)
    saved_single = measure_saved_bytes(single, lambda: single(joint, vec, cos, sin), joint)
    input_double = saved_double.region_input * (text_tokens + image_tokens) // image_tokens
    if blocks_recomputed(recipe):
        kept = args.depth * input_double + args.depth_single * saved_single.region_input
    else:
        kept = args.depth * saved_double.all_saved + args.depth_single * saved_single.all_saved
    working = max(saved_double.all_saved, saved_single.all_saved)  # a recomputed block, or a block's gradients
    if materialises_scores(recipe, lane):
        working += REFERENCE_SCORE_ARRAYS * B * args.n_heads * (text_tokens + image_tokens) ** 2 * dtype.itemsize
    mesh = recipe.parallel.mesh_axes(devices)
    plan = sharding_plan("flux")
    named = dict(model.named_parameters())
    plan.check(named, mesh)
    local = sum(plan.local_numel(name, tuple(p.shape), mesh) for name, p in named.items())
    gathered = 0
    if devices > 1:
        biggest = max(parameter_count(model.double_blocks[0]), parameter_count(model.single_blocks[0]))
        gathered = 2 * biggest * (2 if recipe.parallel.param_dtype == "bfloat16" else 4)
    memory = MemoryPlan(
        parameters=4 * local,
        gradients=4 * local,
        optimizer=8 * local,
        activations=kept,
        transient=working + gathered,
    )
    encoders = (
        0
        if recipe.model.encodings_cache or recipe.model.text_encoders in RANDOM_TEXT_ENCODERS
        else 2 * sum(FROZEN_ENCODER_PARAMETERS.values())
    )
    host = plan_host_memory(
        {name: tuple(p.shape) for name, p in named.items()},
        plan,
        mesh,
        chip,
        chips,
        planned_lane(recipe.device.lane, chip),
        async_checkpoint=recipe.checkpoint.async_save,
        final_save=recipe.output.save_weights or recipe.checkpoint.export_hf,
        whole_read_bytes=encoders,  # each process reads the frozen encoders whole, then moves them to its device
    )
    return FluxRunPlan(
        recipe=recipe.name,
        flavor=recipe.model.flavor,
        parameters=parameters,
        flops_per_sample=model.flops_per_sample(image_tokens, text_tokens),
        image_tokens=image_tokens,
        text_tokens=text_tokens,
        chip=chip,
        devices=devices,
        batch_per_device=B,
        memory=memory,
        frozen_encoders=encoders,
        target_mfu=target_mfu,
        host=host,
        mesh=mesh,
    )


def flux_plan_table(plan: FluxRunPlan) -> Table:
    """The FLUX plan as a two-column table."""
    gib = 1024**3
    memory = plan.memory
    table = Table(title=f"dry run: {plan.recipe} on {plan.devices} x {plan.chip.name}", show_header=False)
    table.add_row("model", f"FLUX.1 {plan.flavor} transformer")
    table.add_row("parameters", f"{plan.parameters:,} ({plan.parameters / 1e9:.2f}B)")
    table.add_row("tokens per sample", f"{plan.image_tokens:,} image + {plan.text_tokens} text")
    table.add_row(
        "FLOPs per sample", f"{plan.flops_per_sample / 1e12:,.1f} TFLOP (training; titanpod.models.flux.counting)"
    )
    split = " x ".join(f"{axis} {size}" for axis, size in plan.mesh.items() if size > 1)
    table.add_row("mesh", split or (f"fsdp {plan.devices}" if plan.devices > 1 else "one device"))
    per_step = plan.batch_per_device * plan.data_ranks
    table.add_row("batch", f"{plan.batch_per_device} per data rank; {per_step} per step")
    table.add_row("  parameters (fp32)", f"{memory.parameters / gib:,.2f} GiB")
    table.add_row("  gradients (fp32)", f"{memory.gradients / gib:,.2f} GiB")
    table.add_row("  optimizer state (AdamW, fp32)", f"{memory.optimizer / gib:,.2f} GiB")
    table.add_row("  activations", f"{memory.activations / gib:,.2f} GiB")
    table.add_row("  working memory (backward, gathers)", f"{memory.transient / gib:,.2f} GiB")
    table.add_row("  frozen encoders (bf16)", f"{plan.frozen_encoders / gib:,.2f} GiB")
    verdict = "[green]fits[/]" if plan.device_fits else "[bold red]does not fit[/]"
    table.add_row(
        "  total",
        f"{plan.total_bytes / gib:,.2f} of {plan.chip.memory_bytes / gib:.1f} GiB "
        f"(plans may use {FIT_FRACTION:.0%}): {verdict}",
    )
    table.add_row(f"step time at {plan.target_mfu:.0%} MFU", f"{plan.step_seconds:.3g} s")
    add_host_row(table, plan.host)
    return table
