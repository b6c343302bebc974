"""A compiled whole step that says plainly when its device has no room for it.

On the tpu lane ``torch.compile(backend="tpu")`` compiles the captured step at its first call, and libtpu's
compiler refuses a program whose temporaries exceed the chip (``ran out of memory on HBM``); the allocator
refuses buffers the same way later (``RESOURCE_EXHAUSTED``). Either surfaces as a compiler backend's error
hundreds of lines long. ``SaysWhenDeviceFull`` turns it into ``DoesNotFitDevice`` with the settings that shrink
the step, before any step has run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from titanpod.device import Backend
from titanpod.graph.config import TrainConfig


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
            # graph.xla's package builds the xla step, which compiles through this module: import on failure only
            from titanpod.graph.xla.fit import is_out_of_memory, out_of_device_memory

            if not is_out_of_memory(error):
                raise
            raise out_of_device_memory(error, None, self._backend.memory_stats(), self._config) from error
        self._ran = True
        return out
