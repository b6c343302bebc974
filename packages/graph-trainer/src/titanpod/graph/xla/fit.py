"""Does the xla step fit its device? Checked before the step allocates its state, and said plainly when not.

Two moments, each with the device's own capacity (``Backend.memory_stats``; only where the device reports it: a
TPU or GPU, not JAX on the CPU):

1. Before the AdamW moments are made (``check_state_fits``): the parameters are placed, so their bytes a device
   are known exactly; the moments take twice that. Refused there, nothing is allocated.
2. When the device refuses the memory the step's compiled program asks for as it starts
   (``RESOURCE_EXHAUSTED``), ``titanpod.graph.device_full.out_of_device_memory`` (shared with the lanes that
   compile through ``torch.compile``) turns the allocator's words into ``DoesNotFitDevice``:
   the program's bytes as the compiler counts them, its largest part and the settings that shrink it.
   The compiler's figure alone does not decide: on a v5e with libtpu 0.0.42.1 it counted 9.80 GiB of
   temporaries for Qwen 3 0.6B at 4 x 4,096 tokens where the chip reserved 6.22 GiB and the step ran.

``DoesNotFitDevice`` is raised instead of the allocator's error mid-run; the dry-run planner
(``titanpod.recipes.planner``) is the check before anything is built.
"""

from __future__ import annotations

from titanpod.device.memory import MemoryStats
from titanpod.graph.device_full import GIB, DoesNotFitDevice, device_capacity


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
