"""TPU slices by name, and their chips as the TPU compiler sees them from a host that has none.

A slice is named the way Cloud TPU names accelerator types: ``v5p-8`` (v4 and v5p count
TensorCores, two a chip: 4 chips), ``v6e-256`` and ``v5litepod-16`` (v5e and v6e count
chips). ``abstract_devices`` asks libtpu for the slice's topology
(``jax.experimental.topologies``): devices that no program runs on, but that ``jax.jit``
can compile for, so a pod's step is compiled and measured before anyone rents the pod.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from titanpod.device.chips import CHIPS

_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
"""What the number in an accelerator type counts: TensorCores (two a chip) or chips."""

_TORUS_3D = {"v4", "v5p"}
"""Chips wired as a 3-D torus (topologies ``AxBxC``); the others are 2-D (``AxB``)."""

_TOPOLOGY_PREFIX = {"v4": "v4", "v5p": "v5p", "v5e": "v5e", "v6e": "v6e"}

_HOST_GRID = (2, 2, 1)
"""The chips of one TPU VM of a multi-host slice as a grid (x, y, z): four chips, 2 x 2."""

_SLICE_NAME = re.compile(r"^(v4|v5p|v5e|v5litepod|v6e)-(\d+)$")


@dataclass(frozen=True)
class TpuSlice:
    """One TPU slice (or several alike, joined over the data-center network)."""

    chip: str
    """The chip kind, as ``titanpod.device.CHIPS`` names it (``v5p``, ``v6e`` ...)."""
    chips: int
    """Chips in one slice."""
    num_slices: int = 1
    """Slices joined into one job (multi-slice); each holds ``chips`` chips."""

    @property
    def name(self) -> str:
        """The accelerator type, e.g. ``v5p-8`` for 4 v5p chips; ``2 x v5p-256`` for two slices."""
        cores = self.chips * _CORES_PER_CHIP[self.chip]
        prefix = "v5litepod" if self.chip == "v5e" else self.chip
        one = f"{prefix}-{cores}"
        return one if self.num_slices == 1 else f"{self.num_slices} x {one}"

    @property
    def total_chips(self) -> int:
        """Chips over every slice of the job."""
        return self.chips * self.num_slices

    def topology_name(self) -> str:
        """libtpu's name of one slice's shape, e.g. ``v5p:2x2x1`` (4 chips) or ``v6e:16x16``."""
        return f"{_TOPOLOGY_PREFIX[self.chip]}:{'x'.join(map(str, torus_shape(self.chip, self.chips)))}"

    def chips_per_host_bounds(self) -> tuple[int, int, int]:
        """The chips one host holds, as libtpu's (x, y, z) grid over one slice's torus (``host_bounds``)."""
        return host_bounds(torus_shape(self.chip, self.chips))


def parse_slice(text: str) -> TpuSlice:
    """The slice named ``text``: an accelerator type (``v5p-8``, ``v6e-256``, ``v5litepod-16``), optionally
    ``N x`` in front for N slices (``2xv5p-256``). ``ValueError`` says what is wrong and what is accepted."""
    cleaned = text.strip().lower().replace(" ", "")
    count, _, one = cleaned.rpartition("x") if re.match(r"^\d+x", cleaned) else ("1", "", cleaned)
    match = _SLICE_NAME.match(one)
    if match is None or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"{text!r} is not a TPU slice name; use an accelerator type such as v5p-8, v5p-256, v6e-64 or "
            "v5litepod-16 (v4 and v5p count TensorCores, two a chip), with 'N x' in front for N slices."
        )
    prefix, number = match.group(1), int(match.group(2))
    chip = "v5e" if prefix == "v5litepod" else prefix
    cores = _CORES_PER_CHIP[chip]
    if number % cores:
        raise ValueError(f"{text!r}: a {chip} slice counts {cores} TensorCores a chip, so its number is even.")
    tpu = TpuSlice(chip, number // cores, int(count))
    torus_shape(tpu.chip, tpu.chips)  # a count no topology has fails here, naming the ones that exist
    return tpu


def slice_of(chip: str, chips: int) -> TpuSlice:
    """The one slice of ``chips`` chips of kind ``chip`` (a recipe's target); ``ValueError`` for a chip that is
    no TPU libtpu compiles for, or a count no slice has."""
    if chip not in _CORES_PER_CHIP:
        known = ", ".join(sorted(_CORES_PER_CHIP))
        raise ValueError(f"{chip!r} is not a TPU the compiler here targets; choose one of {known}.")
    torus_shape(chip, chips)
    return TpuSlice(chip, chips)


def torus_shape(chip: str, chips: int) -> tuple[int, ...]:
    """The slice's chips as a torus: 3-D for v4 and v5p (``2x2x1`` for 4 chips, doubling the smallest side
    first), 2-D for v5e and v6e (``2x2``, ``2x4``, ``4x4`` ...). ``ValueError`` where no slice has that count."""
    dims = 3 if chip in _TORUS_3D else 2
    if chips < 1 or chips & (chips - 1):
        raise ValueError(f"A {chip} slice has a power-of-two number of chips; {chips} is not one.")
    too_small = chip in _TORUS_3D and chips < 4
    if too_small or (chip not in _TORUS_3D and chips > 256):
        raise ValueError(f"No {chip} slice has {chips} chips.")
    if chip in _TORUS_3D and chips == 4:
        return (2, 2, 1)
    shape = [1] * dims
    for _ in range(int(math.log2(chips))):
        smallest = min(range(dims), key=lambda axis: (shape[axis], axis))
        shape[smallest] *= 2
    return tuple(sorted(shape))


def host_bounds(torus: tuple[int, ...]) -> tuple[int, int, int]:
    """The chips of one host over a slice shaped ``torus`` (``torus_shape``), as libtpu's ``chips_per_host_bounds``.

    A slice of a host or more holds whole 2 x 2 hosts; a smaller one (v5litepod-1, v6e-1, a 1 x 2 slice) is all
    on one host, which holds only the slice's own chips: libtpu refuses a host grid wider than the torus on any
    side (``v5e:1x1`` with a 2 x 2 x 1 host does not exist), so each side is the smaller of the two.
    """
    sides = (*torus, 1, 1)[:3]
    x, y, z = (min(host, side) for host, side in zip(_HOST_GRID, sides, strict=True))
    return x, y, z


def abstract_devices(tpu: TpuSlice) -> list[Any]:
    """The slice's devices as libtpu describes them (every chip of every slice, in the topology's order):
    ``jax.jit`` compiles for them on a host without TPUs. Needs libtpu (the tpu environment, ``envs/tpu``);
    ``RuntimeError`` says so where it is missing."""
    try:
        from jax.experimental import topologies
    except ImportError as error:  # pragma: no cover - jax is a dependency wherever this is called
        raise RuntimeError(f"Compiling for a TPU slice needs JAX with libtpu ({error}).") from error
    config = "megacore" if tpu.chip in _TORUS_3D else "default"
    try:
        topology = topologies.get_topology_desc(
            platform="tpu",
            topology_name=tpu.topology_name(),
            chip_config_name=config,
            chips_per_host_bounds=tpu.chips_per_host_bounds(),
            num_slices=tpu.num_slices,
        )
    except Exception as error:
        raise RuntimeError(
            f"libtpu could not describe {tpu.name} ({tpu.topology_name()}, chips a host "
            f"{'x'.join(map(str, tpu.chips_per_host_bounds()))}): {error}. Compiling for a TPU slice "
            "needs libtpu beside JAX: run from the tpu environment (cd envs/tpu && uv run ...)."
        ) from error
    devices = list(topology.devices)
    if len(devices) != tpu.total_chips * CHIPS[tpu.chip].devices_per_chip:
        raise RuntimeError(f"libtpu gave {len(devices)} devices for {tpu.name}, expected {tpu.total_chips}.")
    return devices
