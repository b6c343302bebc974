"""A training step that says plainly when its device has no room for it: ``DoesNotFitDevice`` with the settings
that shrink the step, in place of a device's or compiler's refusal.

On the tpu lane ``torch.compile(backend="tpu")`` compiles the captured step at its first call, and libtpu's
compiler refuses a program whose temporaries exceed the chip (``ran out of memory on HBM``); the allocator
refuses buffers the same way later (``RESOURCE_EXHAUSTED``). Either surfaces as a compiler backend's error
hundreds of lines long. ``SaysWhenDeviceFull`` turns it into ``DoesNotFitDevice`` with the settings that shrink
the step, before any step has run. The xla lane's step (``titanpod.graph.xla.step``) says its allocator's
refusal with ``out_of_device_memory`` too, adding its compiled program's figures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from titanpod.device import Backend
from titanpod.device.memory import MemoryStats
from titanpod.graph.config import TrainConfig

if TYPE_CHECKING:
    from titanpod.graph.xla.program_figures import DeviceMemory

GIB = 1024**3


class DoesNotFitDevice(ValueError):
    """What the step needs a device is more than the device holds; nothing has run."""


def device_capacity(stats: MemoryStats) -> int | None:
    """The device's capacity in bytes, where the lane reports its accelerator's memory; ``None`` otherwise."""
    return stats.limit_bytes if stats.kind == "device" and stats.limit_bytes else None


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


class SaysWhenDeviceFull:
    """``program`` (a lane's compiled step) whose first call, where the compile happens, raises
    ``DoesNotFitDevice`` in place of a device-memory refusal; later calls go straight through."""

    def __init__(self, program: Callable[..., Any], backend: Backend, config: TrainConfig) -> None:
        self._program = program
        self._backend = backend
        self._config = config
        self._ran = False

    def __call__(self, *args: Any) -> Any:
        if self._ran:
            return self._program(*args)
        try:
            out = self._program(*args)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            raise out_of_device_memory(error, None, self._backend.memory_stats(), self._config) from error
        self._ran = True
        return out
