"""Host memory of a run: what each process (rank) and each worker VM (host) holds in RAM, phase by phase.

Counted from the model's parameter shapes, the family's sharding plan and the mesh, in fp32
(master weights and AdamW moments are fp32; a checkpoint may store less, never more).

On the torch lanes (``tpu``, ``cuda``, ``torch_xla``) there is one process per device and
parameters are made on the device, so a process holds on the host only what passes through:

- init: one parameter's local shard, drawn on the host before it is copied to the device (the largest);
- load: the largest slice read at once, and its converted copy on the way to the device (or,
  when larger, frozen models loaded whole on the host before they move to the device);
- training: what the ``offload`` memory policy moves to the host;
- checkpoint: training, plus the whole local state (weights and two moments) staged for an
  async save, or one shard at a time for a synchronous one;
- final save: rank 0 gathers the largest tensor whole and holds its write buffer as large;
  every other rank holds its shard of it.

On the ``xla`` lane one process per host drives the host's D devices and keeps their shards on
the host (``resident``: D x the local share) through every phase; loading reads D slices at
once, and a checkpoint (Orbax) copies the D devices' whole state to the host.

A worker VM holds the processes of its chips; the VM of rank 0 is the one counted (it also
writes). Its peak is its largest phase, checked against the VM's memory in the chip table
(``ChipSpec.host_vm_bytes``) with the headroom devices get (``FIT_FRACTION``); a slice smaller
than one VM gets that share of it. Where the table has no figure the plan says so and checks
nothing. On the ``cpu`` lane device memory is host memory: nothing more is counted. The tile the
initialiser draws beyond a shard (KiB to a few MiB) is left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from titanpod.device import ChipSpec, backend_class
from titanpod.parallel import ShardingPlan
from titanpod.recipes.planner.limits import FIT_FRACTION

FP32 = 4
"""Bytes per element of what the host holds: fp32 master weights and moments."""

STATE_COPIES = 3
"""Tensors per parameter in a trainer-state checkpoint: the weights and AdamW's two moments."""

PHASES = {
    "init": "initialisation",
    "load": "loading weights",
    "train": "training",
    "checkpoint": "trainer-state checkpoint",
    "save": "final save",
}
"""Phase field -> the words the dry run prints."""


@dataclass(frozen=True)
class HostBytes:
    """Bytes of host memory at each phase of a run (of one process, or of one worker VM)."""

    init: int
    """While the parameters are created (or, on the xla lane, placed)."""
    load: int
    """While weights are read from a checkpoint or a Hugging Face folder."""
    train: int
    """During training steps."""
    checkpoint: int
    """While a trainer-state checkpoint is written (training goes on during an async save)."""
    save: int
    """While the final weights are gathered and written."""

    @property
    def peak(self) -> tuple[str, int]:
        """The phase that needs the most, and its bytes."""
        return max(((name, getattr(self, name)) for name in PHASES), key=lambda item: item[1])

    def plus(self, other: HostBytes, times: int = 1) -> HostBytes:
        """Phase by phase, these bytes and ``times`` x ``other``'s."""
        return HostBytes(**{name: getattr(self, name) + times * getattr(other, name) for name in PHASES})


@dataclass(frozen=True)
class HostMemoryPlan:
    """Host memory of one run on one slice: per process and per worker VM."""

    lane: str
    """The lane planned for."""
    chip: ChipSpec
    """The chip, whose table entry gives the VM."""
    processes_per_host: int
    """Processes on one worker VM (1 on the xla lane)."""
    devices_per_process: int
    """Devices one process drives (the VM's devices on the xla lane, else 1)."""
    rank0: HostBytes
    """The process of rank 0 (which gathers and writes the final weights)."""
    other: HostBytes
    """Every other process."""
    per_host: HostBytes | None
    """The worker VM of rank 0: all its processes together; ``None`` when chips per VM are unknown."""
    host_bytes: int | None
    """Memory of that VM (its share, for a slice smaller than one VM); ``None`` when unknown."""
    largest_tensor: str
    """The parameter the final save gathers that is largest."""

    @property
    def fits(self) -> bool | None:
        """Whether the VM's peak leaves the system its share; ``None`` when the VM's memory is unknown."""
        if self.per_host is None or self.host_bytes is None:
            return None
        return self.per_host.peak[1] <= FIT_FRACTION * self.host_bytes


def planned_lane(configured: str, chip: ChipSpec) -> str:
    """The lane a run takes on ``chip``: the configured one, or for ``auto`` the one the chip's host picks."""
    return chip.auto_lane if configured == "auto" else configured


def plan_host_memory(
    shapes: Mapping[str, tuple[int, ...]],
    plan: ShardingPlan,
    mesh: Mapping[str, int],
    chip: ChipSpec,
    chips: int,
    lane: str,
    *,
    offload_per_device: int = 0,
    async_checkpoint: bool = False,
    final_save: bool = True,
    whole_read_bytes: int = 0,
) -> HostMemoryPlan | None:
    """Host memory of a run whose parameters have full ``shapes``, split by ``plan`` over ``mesh``.

    ``offload_per_device``: bytes the memory policy moves to the host per device;
    ``async_checkpoint``: trainer-state saves stage the whole local state on the host;
    ``final_save``: the run gathers and writes its weights at the end;
    ``whole_read_bytes``: what each process loads whole on the host before it moves to the device
    (frozen encoders), at another moment than the sharded weights. ``None`` on the ``cpu`` lane,
    where device memory is host memory.
    """
    traits = backend_class(lane)
    if traits.device_memory_is_host:
        return None
    local = {name: plan.local_numel(name, shape, mesh) for name, shape in shapes.items()}
    largest_local = max(local.values())
    largest_name = max(shapes, key=lambda name: math.prod(shapes[name]))
    largest_full = math.prod(shapes[largest_name])
    state = FP32 * STATE_COPIES * sum(local.values())
    chips_on_host = min(chips, chip.chips_per_host or 1)
    devices_on_host = chips_on_host * chip.devices_per_chip
    if not traits.single_controller:
        processes, devices = devices_on_host, 1
        resident, send = 0, FP32 * largest_local
    else:
        processes, devices = 1, devices_on_host
        resident, send = FP32 * devices * sum(local.values()), 0
    read = max(2 * FP32 * devices * largest_local, whole_read_bytes)
    train = resident + devices * offload_per_device
    other = HostBytes(
        init=resident + FP32 * largest_local,
        load=resident + read,
        train=train,
        checkpoint=train + (devices * state if async_checkpoint or traits.single_controller else send),
        save=resident + send if final_save else resident,
    )
    rank0 = dataclasses.replace(other, save=resident + 2 * FP32 * largest_full if final_save else resident)
    known = chip.chips_per_host is not None
    host_bytes = None
    if known and chip.host_vm_bytes is not None:
        host_bytes = chip.host_vm_bytes * chips_on_host // chip.chips_per_host
    return HostMemoryPlan(
        lane=lane,
        chip=chip,
        processes_per_host=processes,
        devices_per_process=devices,
        rank0=rank0,
        other=other,
        per_host=rank0.plus(other, processes - 1) if known else None,
        host_bytes=host_bytes,
        largest_tensor=largest_name,
    )
