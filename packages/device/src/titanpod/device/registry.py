"""Which backend class runs each lane: a table of lane names that imports a lane's module only when it is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from titanpod.device.backend import Backend


@dataclass(frozen=True)
class LaneRegistry:
    """Lane names, each with its backend class (or where to import it from), and the order ``auto`` tries them."""

    entries: Mapping[str, str | type[Backend]]
    """Lane name -> ``"module:ClassName"``, imported on the first look-up, or the class itself (a lane defined
    in code already imported). Listed in the order of the lane table in docs/architecture.md (Lanes)."""
    auto_order: tuple[str, ...] = field(default=())
    """The lanes the automatic choice tries, first match wins (``Backend.detected``); a lane left out is used
    only when asked for by name."""

    @property
    def names(self) -> tuple[str, ...]:
        """Every lane name, in table order."""
        return tuple(self.entries)

    def backend_class(self, lane: str) -> type[Backend]:
        """The backend class of ``lane``, importing its module (and nothing else); ``KeyError`` names the lanes."""
        if lane not in self.entries:
            raise KeyError(f"Unknown lane {lane!r}; lanes: {', '.join(self.entries)}.")
        entry = self.entries[lane]
        if not isinstance(entry, str):
            return entry
        module, _, name = entry.partition(":")
        backend: type[Backend] = getattr(importlib.import_module(module), name)
        return backend

    def with_lane(self, backend: type[Backend], auto_first: bool = False) -> LaneRegistry:
        """A registry that also holds ``backend`` under its ``lane`` name (tried first by ``auto`` when
        ``auto_first``); this registry is left as it was."""
        auto_order = (backend.lane, *self.auto_order) if auto_first else self.auto_order
        return LaneRegistry({**self.entries, backend.lane: backend}, auto_order)


LANE_REGISTRY = LaneRegistry(
    {
        "cpu": "titanpod.device.backends.cpu:CpuBackend",
        "cuda": "titanpod.device.backends.cuda:CudaBackend",
        "xla": "titanpod.device.backends.xla:XlaBackend",
        "tpu": "titanpod.device.backends.tpu:TpuBackend",
        "torch_xla": "titanpod.device.backends.torch_xla:TorchXlaBackend",
    },
    auto_order=("tpu", "torch_xla", "cuda", "cpu"),
)
"""The lanes titanpod ships. The ``xla`` lane is never picked automatically: ask for it."""


def backend_class(lane: str, registry: LaneRegistry = LANE_REGISTRY) -> type[Backend]:
    """The backend class of ``lane``, without constructing it: its class attributes are the lane's traits
    (``single_controller``, ``supports_pipeline``, ``launch`` ...), readable where the lane cannot run."""
    return registry.backend_class(lane)
