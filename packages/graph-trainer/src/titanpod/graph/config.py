"""The training part of a run's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from titanpod.models.field_checks import check_field_types, expand_home, real_number, whole_number

StepMode = Literal["eager", "per_block", "whole_step"]
"""What ``TrainConfig.step_mode`` accepts."""
MemoryPolicy = Literal["save", "recompute", "selective", "offload"]
"""What ``TrainConfig.memory_policy`` accepts."""
Precision = Literal["fp32", "bf16"]
"""What ``TrainConfig.precision`` accepts."""
Decay = Literal["cosine", "linear", "constant"]
"""What ``TrainConfig.decay`` accepts."""
Compiler = Literal["auto", "none"]
"""What ``TrainConfig.compiler`` accepts."""
WholeStepUpdate = Literal["auto", "in_program", "after_program"]
"""What ``TrainConfig.whole_step_update`` accepts."""
StepCompilerName = Literal["inductor", "cached"]
"""What ``TrainConfig.step_compiler`` accepts."""

STEP_MODES: tuple[str, ...] = get_args(StepMode)
MEMORY_POLICIES: tuple[str, ...] = get_args(MemoryPolicy)
PRECISIONS: tuple[str, ...] = get_args(Precision)
SEED_MAX = 2**32 - 1
"""The largest ``train.seed``: data orders seed generators with ``seed * 1_000_003 + epoch``, which must fit."""


@dataclass(frozen=True)
class TrainConfig:
    """How many steps, how fast to learn, how each step runs, and how often to report."""

    steps: int = 100
    """Optimizer steps to run (1 or more)."""
    lr: float = 3e-3
    """Peak learning rate, reached at the end of warmup: a finite number, 0 or more."""
    warmup_steps: int | None = None
    """Steps of linear warmup: warmup step k uses ``k / warmup_steps`` of ``lr``. ``None`` (the default)
    scales with the run: ``min(10, steps // 10)`` (10 for 100 steps or more, 0 for fewer than 10); read the
    number in effect from ``resolved_warmup_steps``. A number must be below ``steps``."""
    decay: Decay = "cosine"
    """Shape of the decay after warmup: ``cosine``, ``linear`` or ``constant``."""
    min_lr_ratio: float = 0.1
    """The learning rate at the last step, as a fraction of ``lr`` (0 to 1)."""
    weight_decay: float = 0.1
    """AdamW weight decay, applied to matrices only (not norms): 0 or more."""
    beta1: float = 0.9
    """AdamW first-moment decay, in [0, 1)."""
    beta2: float = 0.95
    """AdamW second-moment decay, in [0, 1)."""
    eps: float = 1e-8
    """AdamW epsilon: above 0."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 turns clipping off (the norm is still logged)."""
    seed: int = 0
    """Seed for weight init and data order: 0 to 2**32 - 1."""
    log_every: int = 10
    """Read losses back from the device and write metrics every this many steps."""
    step_mode: StepMode = "eager"
    """How a step runs: ``eager`` (op by op), ``per_block`` (each transformer block
    compiled by ``torch.compile``), or ``whole_step`` (forward, loss, backward and the
    AdamW update captured as one graph and compiled as one program)."""
    memory_policy: MemoryPolicy = "save"
    """What the whole-step graph keeps for the backward: ``save`` (every activation),
    ``recompute`` (only block inputs; the rest is recomputed in the backward),
    ``selective`` (block inputs and matmul/attention outputs; cheap ops are recomputed),
    ``offload`` (as ``recompute``, with the block inputs kept in host memory)."""
    whole_step_update: WholeStepUpdate = "auto"
    """Where a ``whole_step`` step applies AdamW: ``in_program`` (inside the compiled program, beside forward and
    backward), ``after_program`` (the program returns the gradients and the update runs after it, in place, op by
    op, as the eager step does it), or ``auto``: ``after_program`` on a lane whose compiler cannot write the
    program's results into its inputs' buffers (the tpu lane: the program would otherwise hold the parameters
    and both moments twice, 6.66 GiB more for Qwen 3 0.6B), else ``in_program``. The xla lane's step ignores it."""
    compiler: Compiler = "auto"
    """Compiler for ``per_block`` and ``whole_step``: ``auto`` (the lane's: inductor on
    cpu/cuda, the tpu backend on tpu, ``jax.jit`` on xla) or ``none`` (run the captured
    graph as it is, op by op: for debugging and quick tests)."""
    step_compiler: StepCompilerName = "inductor"
    """How the whole step is compiled on the cpu and cuda lanes (``titanpod.graph.step_compiler``): ``inductor``
    (``torch.compile`` of the captured step, with inductor's own caches) or ``cached`` (titanpod's compiled-step
    cache, ``titanpod.graph.cpu_compile``: the step compiled once into ``compile_cache_dir`` and loaded by a later
    run of the same recipe without capturing it; on the CPU, C++ kernels built as they are generated. It relies
    on inductor internals and refuses a torch release it was not checked against). Other lanes ignore it."""
    compile_cache_dir: str = "default"
    """Where a compiled whole step is kept, so the next run that builds the same program loads it instead of
    compiling again: with ``step_compiler='cached'``, inductor's artifacts on the cpu and cuda lanes (with a
    shortcut under the step's fingerprint, so a later run of the same recipe loads the step without capturing
    it, and the outcome of the CPU's vector-instruction check); JAX's persistent compilation cache (its ``xla``
    subfolder) on the xla lane.
    ``default`` (``$XDG_CACHE_HOME/titanpod/compiled-steps``, else ``~/.cache/titanpod/compiled-steps``), a
    folder, or ``off`` (compile every run afresh). The folder holds code that is loaded and run: keep it one
    only you write."""
    keep_host_memory: bool = True
    """On the cpu lane, keep freed host memory in the process (glibc: no ``mmap`` per allocation, no trimming) so
    a step's buffers are reused instead of faulted in anew each step; the process then stays at its peak size.
    See ``titanpod.device.host_memory``."""
    scan_layers: bool = False
    """On the xla lane, run the model's transformer blocks as one ``jax.lax.scan`` over their parameters stacked
    [layers, ...] (``titanpod.graph.xla.scan``), instead of one copy of each block in the program: the program
    and its compile time stop growing with depth. Each trip runs one block as the unrolled step does (its memory
    policy, its FSDP gather inside), so the losses and updates are the same. The step holds the blocks'
    parameters and AdamW moments stacked; ``state_dict()`` and checkpoints still name them per layer. Every block
    must hold the same parameters. Other lanes ignore it."""
    optimizer_offload: bool = False
    """On the xla lane, keep AdamW's two moments in the host's pinned memory between steps (JAX's
    ``pinned_host`` memory kind): the step moves them to the device for the update and back, so the device holds
    parameters, gradients and activations only. For a model whose fp32 moments do not fit beside the rest (Llama
    3.2 1B on a 16 GiB chip); each step then moves 16 bytes a parameter between host and device. Other lanes
    refuse it."""
    optimizer_offload_overlap: bool = False
    """With ``optimizer_offload``: let a piece's moments come to the device while the piece before's go back to
    the host, so the two directions of the trip can overlap; the device then holds two pieces' moments at once
    during the update instead of one (``titanpod.graph.xla.step_program.streamed_update``). The same arithmetic."""
    grad_accum_steps: int = 1
    """Micro-batches whose gradients are averaged into one optimizer step."""
    sum_gradients_in_loop: bool = False
    """On the xla lane with ``scan_layers`` and more than one micro-batch a step: the blocks' loop adds each
    micro-batch's gradient of their parameters into the step's running sum as its backward goes, rather than
    handing out a gradient beside the sum, so the step holds one fp32 copy of those gradients instead of two
    (``titanpod.graph.xla.gradient_sums``; each block is recomputed from its input in the backward, as
    ``memory_policy recompute`` does). The same sums. Other lanes, and steps of one micro-batch, ignore it."""
    precision: Precision = "fp32"
    """Compute precision: ``fp32``, or ``bf16`` (autocast; parameters, gradients and
    optimizer state stay fp32)."""
    stop_at_step: int = 0
    """End this run after this step (0: run to ``steps``). The schedule still spans
    ``steps``: for time-limited jobs that save a checkpoint and continue with ``--resume``."""
    skip_nonfinite: bool = True
    """When the gradient norm is NaN or Inf: skip the update (True: parameters and
    optimizer state stay as they were, and the step is counted as skipped) or stop the
    run with a message (False)."""

    def __post_init__(self) -> None:
        check_field_types(self, "train")
        expand_home(self, "compile_cache_dir")
        whole_number("train.steps", self.steps, at_least=1)
        real_number("train.lr", self.lr, at_least=0)
        real_number("train.min_lr_ratio", self.min_lr_ratio, at_least=0, at_most=1)
        real_number("train.weight_decay", self.weight_decay, at_least=0)
        real_number("train.beta1", self.beta1, at_least=0, below=1)
        real_number("train.beta2", self.beta2, at_least=0, below=1)
        real_number("train.eps", self.eps, above=0)
        real_number("train.grad_clip", self.grad_clip, at_least=0)
        whole_number("train.seed", self.seed, at_least=0, at_most=SEED_MAX)
        if self.warmup_steps is not None and not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"train.warmup_steps={self.warmup_steps} does not fit train.steps={self.steps}: warmup must be 0 or "
                f"more and end before the last step. Set --train.warmup-steps below {self.steps}, or leave it unset "
                f"to scale with the run (min(10, steps // 10): {default_warmup_steps(self.steps)} here)."
            )
        _check_choice("decay", self.decay, get_args(Decay))
        if self.log_every < 1:
            raise ValueError(f"train.log_every must be at least 1, got {self.log_every}.")
        _check_choice("step_mode", self.step_mode, STEP_MODES)
        _check_choice("memory_policy", self.memory_policy, MEMORY_POLICIES)
        _check_choice("compiler", self.compiler, get_args(Compiler))
        _check_choice("whole_step_update", self.whole_step_update, get_args(WholeStepUpdate))
        _check_choice("step_compiler", self.step_compiler, get_args(StepCompilerName))
        _check_choice("precision", self.precision, PRECISIONS)
        if not 0 <= self.stop_at_step <= self.steps:
            raise ValueError(f"train.stop_at_step must be in [0, steps={self.steps}], got {self.stop_at_step}.")
        if self.grad_accum_steps < 1:
            raise ValueError(f"train.grad_accum_steps must be at least 1, got {self.grad_accum_steps}.")
        if self.optimizer_offload_overlap and not self.optimizer_offload:
            raise ValueError(
                "train.optimizer_offload_overlap overlaps the trips of AdamW's moments between host and device, "
                "which only train.optimizer_offload makes: set --train.optimizer-offload too, or drop "
                "--train.optimizer-offload-overlap."
            )
        if self.sum_gradients_in_loop and not self.scan_layers:
            raise ValueError(
                "train.sum_gradients_in_loop sums the gradients inside the loop over the stacked blocks, which only "
                "train.scan_layers makes: set --train.scan-layers too, or drop --train.sum-gradients-in-loop."
            )
        if self.memory_policy != "save" and self.step_mode != "whole_step":
            raise ValueError(
                f"train.memory_policy={self.memory_policy!r} rewrites the captured step graph, so it needs "
                "train.step_mode='whole_step'; use memory_policy='save' with eager or per_block steps."
            )

    @property
    def resolved_warmup_steps(self) -> int:
        """The warmup in effect: ``warmup_steps``, or when unset ``min(10, steps // 10)``."""
        return default_warmup_steps(self.steps) if self.warmup_steps is None else self.warmup_steps


def default_warmup_steps(steps: int) -> int:
    """The warmup of a run of ``steps`` steps that sets none: ``min(10, steps // 10)``."""
    return min(10, steps // 10)


def _check_choice(field: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"train.{field} must be one of {', '.join(choices)}; got {value!r}.")
