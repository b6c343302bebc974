"""Does the xla step fit its device? Checked before the step allocates its state and before its program first runs.

Two moments, each with the device's own capacity (``Backend.memory_stats``; only where the device reports it: a
TPU or GPU, not JAX on the CPU):

1. Before the AdamW moments are made (``check_state_fits``): the parameters are placed, so their bytes a device
   are known exactly; the moments take twice that.
2. Once the step's program is compiled, before it runs (``check_program_fits``): the compiler's own figure of
   the bytes a device needs (arguments, temporaries, outputs not aliased to arguments, code).

Either refuses with ``DoesNotFitDevice``, naming what takes the room and the settings that shrink it, instead of
the allocator's ``RESOURCE_EXHAUSTED`` mid-run.
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


def check_program_fits(memory: DeviceMemory, stats: MemoryStats, config: TrainConfig) -> None:
    """Refuse when the compiled step needs more bytes a device (the compiler's ``memory``) than the device holds."""
    capacity = device_capacity(stats)
    if capacity is None or memory.total <= capacity:
        return
    part, size = memory.largest()
    fixes = ["a smaller data.batch-size (activations grow with it)"]
    if config.memory_policy in ("save", "selective"):
        fixes.insert(0, f"--train.memory-policy recompute (now {config.memory_policy}: it keeps more activations)")
    fixes.append("kernels.pallas-loss.keep-logits false, where it is on (it keeps the [tokens, vocabulary] logits)")
    if config.grad_accum_steps == 1:
        fixes.append("the same tokens a step in micro-batches (train.grad-accum-steps with a smaller batch)")
    fixes.append("more devices (parallel.fsdp)")
    raise DoesNotFitDevice(
        f"The step's program needs {memory.total / GIB:.2f} GiB a device, as the compiler counts it, and the "
        f"device holds {capacity / GIB:.2f} GiB. The largest part: {part}, {size / GIB:.2f} GiB (arguments "
        f"{memory.arguments / GIB:.2f}, temporaries {memory.temporaries / GIB:.2f}). Nothing has run. To fit: "
        + "; or ".join(fixes)
        + "."
    )
