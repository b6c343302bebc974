"""Does the xla step fit its device? Checked before the step allocates its state, and said plainly when not.

Two moments, each with the device's own capacity (``Backend.memory_stats``; only where the device reports it: a
TPU or GPU, not JAX on the CPU):

1. Before the AdamW moments are made (``check_state_fits``): the parameters are placed, so their bytes a device
   are known exactly; the moments take twice that. Refused there, nothing is allocated.
2. When the device refuses the memory the step's compiled program asks for as it starts
   (``RESOURCE_EXHAUSTED``), ``out_of_device_memory`` turns the allocator's words into ``DoesNotFitDevice``:
   the program's bytes as the compiler counts them, its largest part and the settings that shrink it.
   The compiler's figure alone does not decide: on a v5e with libtpu 0.0.42.1 it counted 9.80 GiB of
   temporaries for Qwen 3 0.6B at 4 x 4,096 tokens where the chip reserved 6.22 GiB and the step ran.

``DoesNotFitDevice`` is raised instead of the allocator's error mid-run; the dry-run planner
(``titanpod.recipes.planner``) is the check before anything is built.
"""

from __future__ import annotations

from titanpod.device.memory import MemoryStats
from titanpod.graph.config import TrainConfig
from titanpod.graph.xla.program_figures import DeviceMemory

GIB = 1024**3


class DoesNotFitDevice(ValueError):
    """What the step needs a device is more than the device holds; nothing has run."""


def device_capacity(stats: MemoryStats) -> int | None:
    """The device's capacity in bytes, where the lane reports its accelerator's memory; ``None`` otherwise."""
    return stats.limit_bytes if stats.kind == "device" and stats.limit_bytes else None


def check_state_fits(param_bytes: int, stats: MemoryStats) -> None:
    """Refuse when AdamW's two moments (twice ``param_bytes``, the parameters' bytes on one device, already placed)
    do not fit in what the device has free."""
    capacity = device_capacity(stats)
    if capacity is None:
        return
    free = capacity - (stats.current_bytes or 0)
    needed = 2 * param_bytes
    if needed <= free:
        return
    raise DoesNotFitDevice(
        f"The parameters take {param_bytes / GIB:.2f} GiB on each device and AdamW's two moments need "
        f"{needed / GIB:.2f} GiB more, where the device has {free / GIB:.2f} GiB of {capacity / GIB:.2f} GiB free. "
        "Nothing has run. To fit: spread the parameters over more devices (parallel.fsdp), or train a smaller "
        "model (model.flavor)."
    )


OUT_OF_MEMORY_WORDS = ("RESOURCE_EXHAUSTED", "ran out of memory on HBM")
"""What a device's refusal for memory says: the allocator's status, and libtpu's compiler refusing a program whose
temporaries exceed the chip (seen from the tpu lane's compile on a v5e)."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a device's refusal for memory: the allocator's (XLA's ``RESOURCE_EXHAUSTED``) or the
    TPU compiler's (``ran out of memory on HBM``)."""
    return any(words in str(error) for words in OUT_OF_MEMORY_WORDS)


def refusal_words(error: BaseException) -> str:
    """The line of ``error``'s message that says what the device refused (its first line where none does)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [""]
    said = next((line for line in lines if any(words in line for words in OUT_OF_MEMORY_WORDS)), lines[0])
    return said[:300]


def out_of_device_memory(
    error: BaseException, memory: DeviceMemory | None, stats: MemoryStats, config: TrainConfig
) -> DoesNotFitDevice:
    """The allocator's refusal of the step's program, said with the program's figures (``memory``, the compiler's
    count; ``None`` where unknown) and the settings that shrink it."""
    capacity = device_capacity(stats)
    holds = "" if capacity is None else f" of the {capacity / GIB:.2f} GiB the device holds"
    figures = ""
    if memory is not None:
        part, size = memory.largest()
        figures = (
            f" The compiler counts {memory.total / GIB:.2f} GiB a device for the step (arguments "
            f"{memory.arguments / GIB:.2f}, temporaries {memory.temporaries / GIB:.2f}); the largest part: {part}, "
            f"{size / GIB:.2f} GiB."
        )
    fixes = ["a smaller data.batch-size (activations grow with it)"]
    if config.memory_policy in ("save", "selective"):
        fixes.insert(0, f"--train.memory-policy recompute (now {config.memory_policy}: it keeps more activations)")
    fixes.append("--kernels.pallas-loss.no-keep-logits, where logits are kept ([tokens, vocabulary] in fp32)")
    if config.grad_accum_steps == 1:
        fixes.append("the same tokens a step in micro-batches (a smaller batch, more train.grad-accum-steps)")
    fixes.append("more devices (parallel.fsdp)")
    words = refusal_words(error)
    return DoesNotFitDevice(
        f"The device has no room for the training step{holds}: {words}.{figures} "
        "Check a configuration before you run it with --dry-run --target.chip CHIP --target.chips N. To fit: "
        + "; or ".join(fixes)
        + "."
    )
