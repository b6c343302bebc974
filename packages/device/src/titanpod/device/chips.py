"""Peak dense bf16 FLOP/s and memory per device, and the worker VMs (hosts) chips sit in, for MFU and
for the planner.

Figures are the vendors' published dense (not sparse) bf16 peaks:
Google Cloud TPU system-architecture pages for v4, v5e, v5p, v6e (Trillium) and
v7 (Ironwood); NVIDIA's H100 SXM, H200 and B200 datasheets. A TPU v7 chip exposes two
devices, so its per-device figures are half the per-chip ones.

Host figures are those of the worker VM a multi-host slice is built from, as the Cloud TPU
documentation publishes them (the source of each is beside it). Where no published figure is
known the field is ``None``, and the planner says it cannot check host memory rather than guess.
A GPU's host is whatever server it is in, so the GPUs have none.

A CPU has no published peak that means anything for PyTorch, so the cpu lane measures
one with a short matmul probe (``measure_cpu_peak``).
"""

from __future__ import annotations

import difflib
import os
import time
from dataclasses import dataclass

GiB = 1024**3
GB = 1000**3
TFLOPS = 1e12


@dataclass(frozen=True)
class ChipSpec:
    """One accelerator device as MFU and memory planning see it."""

    name: str
    """Canonical short name, e.g. ``v5p`` or ``h100``."""
    peak_flops: float
    """Peak dense FLOP/s of one device (bf16 for accelerators; measured fp32 for a CPU)."""
    memory_bytes: int
    """Memory of one device in bytes (HBM for accelerators, host RAM for a CPU)."""
    devices_per_chip: int = 1
    """How many devices (ranks) one physical chip exposes."""
    measured: bool = False
    """True when ``peak_flops`` was measured here rather than taken from a datasheet."""
    auto_lane: str = "cpu"
    """The lane ``auto`` picks where this chip is attached (``tpu``, ``cuda`` or ``cpu``)."""
    chips_per_host: int | None = None
    """Chips one worker VM (host) of a multi-host slice holds; ``None`` when no published figure is known."""
    host_vm_bytes: int | None = None
    """Memory (RAM) of that worker VM in bytes; ``None`` when no published figure is known."""


def _per_device(
    name: str,
    chip_flops: float,
    chip_bytes: int,
    devices: int = 1,
    *,
    lane: str = "tpu",
    chips_per_host: int | None = None,
    host_bytes: int | None = None,
) -> ChipSpec:
    return ChipSpec(
        name,
        chip_flops / devices,
        chip_bytes // devices,
        devices,
        auto_lane=lane,
        chips_per_host=chips_per_host,
        host_vm_bytes=host_bytes,
    )


CHIPS: dict[str, ChipSpec] = {
    # v4: no published figure for the worker VM's chips or memory is known here.
    "v4": _per_device("v4", 275 * TFLOPS, 32 * GiB),
    # v5e: https://cloud.google.com/tpu/docs/v5e, "VM types": the 4-chip VM (ct5lp-hightpu-4t), which
    # multi-host slices use, has 192 GB (the 8-chip VM has 384 GB: the same 48 GB per chip).
    "v5e": _per_device("v5e", 197 * TFLOPS, 16 * GiB, chips_per_host=4, host_bytes=192 * GB),
    # v5p: https://cloud.google.com/tpu/docs/v5p, "VM, host and slice properties": 4 chips, 448 GB RAM.
    "v5p": _per_device("v5p", 459 * TFLOPS, 95 * GiB, chips_per_host=4, host_bytes=448 * GB),
    # v6e: https://cloud.google.com/tpu/docs/v6e, multi-host slices are ct6e-standard-4t VMs of 4 chips;
    # https://cloud.google.com/tpu/docs/tpu7x, "RAM (GB) (4-chip VM)": 720 for v6e.
    "v6e": _per_device("v6e", 918 * TFLOPS, 32 * GiB, chips_per_host=4, host_bytes=720 * GB),
    # v7: https://cloud.google.com/tpu/docs/tpu7x, "RAM (GB) (4-chip VM)": 960 (each VM holds 4 chips).
    "v7": _per_device("v7", 2307 * TFLOPS, 192 * GB, devices=2, chips_per_host=4, host_bytes=960 * GB),
    "h100": _per_device("h100", 989 * TFLOPS, 80 * GB, lane="cuda"),
    "h200": _per_device("h200", 989 * TFLOPS, 141 * GB, lane="cuda"),
    "b200": _per_device("b200", 2250 * TFLOPS, 180 * GB, lane="cuda"),
}
"""Per-device figures by canonical name."""

_ALIASES = {
    "trillium": "v6e",
    "v6lite": "v6e",
    "ironwood": "v7",
    "7x": "v7",
    "v7x": "v7",
    "v5lite": "v5e",
    "v5litepod": "v5e",
}
"""Other spellings: marketing names and the device kinds JAX reports (``TPU v5 lite``)."""

_GPU_MODELS = ("h100", "h200", "b200")


def chip_by_name(name: str) -> ChipSpec:
    """Look a chip up by a loose name: ``v5p``, ``TPU v6e``, ``v5p-128``, ``NVIDIA H100 80GB HBM3``.

    A topology suffix (``-128``) is ignored. Raises ``KeyError`` naming the known chips.
    """
    key = name.lower()
    for noise in ("nvidia", "tpu", " ", "_"):
        key = key.replace(noise, "")
    head, _, tail = key.rpartition("-")
    if head and tail.isdigit():
        key = head
    key = _ALIASES.get(key.replace("-", ""), key.replace("-", ""))
    if key in CHIPS:
        return CHIPS[key]
    for model in _GPU_MODELS:  # product names carry memory size and form factor after the model
        if key.startswith(model):
            return CHIPS[model]
    close = difflib.get_close_matches(key, [*CHIPS, *_ALIASES], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"Unknown chip {name!r}; known chips: {', '.join(CHIPS)}.{hint}")


def host_memory_bytes() -> int:
    """Physical memory of this machine in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def measure_cpu_peak(size: int = 1024, seconds: float = 0.5) -> ChipSpec:
    """Measure this CPU's fp32 matmul rate and return it as a ``ChipSpec``.

    Runs ``size x size`` matmuls for about ``seconds`` on the threads PyTorch uses and
    keeps the best rate of any single call, so MFU on a CPU compares a model against
    what a large matmul gets here.
    """
    import torch

    a = torch.randn(size, size)
    b = torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)  # warm up the BLAS threads
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        elapsed = time.perf_counter() - start
        best = max(best, 2 * size**3 / elapsed)
        if start + elapsed > deadline:
            break
    return ChipSpec("cpu", best, host_memory_bytes(), measured=True)
