"""Peak dense bf16 FLOP/s and memory per device, and the worker VMs (hosts) chips sit in, for MFU and
for the planner.

Figures are the vendors' published dense (not sparse) bf16 peaks:
Google Cloud TPU system-architecture pages for v4, v5e, v5p, v6e (Trillium) and
v7 (Ironwood); NVIDIA's H100 SXM, H200, B200, A100, L4 and L40S datasheets and, for the
GeForce RTX 4090, the NVIDIA Ada GPU Architecture whitepaper (its rate with fp32 accumulation,
which is what PyTorch's bf16 matmuls use). A TPU v7 chip exposes two devices, so its
per-device figures are half the per-chip ones.

Host figures are those of the worker VM a multi-host slice is built from, as the Cloud TPU
documentation publishes them (the source of each is beside it). Where no published figure is
known the field is ``None``, and the planner says it cannot check host memory rather than guess.
A GPU's host is whatever server it is in, so the GPUs have none.

A CPU has no published peak that means anything for PyTorch, so the cpu lane measures
one with a short matmul probe (``measure_cpu_peak``), once per machine: ``titanpod.device.peak_cache`` keeps
the figure in the user's cache folder. The cuda lane measures bf16 matmuls (``measure_gpu_peak``) for a GPU
model the table does not list.
"""

from __future__ import annotations

import difflib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CPU_PEAK_METHOD = "fp32 matmul measured on this machine (best of wall-clock and CPU-time rates)"
"""How a CPU's peak is found, as MFU's summary names it."""

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
    peak_method: str = "the vendor's published dense bf16 peak"
    """Where ``peak_flops`` comes from, in words, shown beside MFU (``fp32 matmul measured on this machine``)."""


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
    # A100: NVIDIA A100 Tensor Core GPU datasheet, "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*"
    # (* with sparsity), the same for SXM and PCIe, 40GB and 80GB; the 80GB variant's memory here (a
    # product name that carries its size, "A100-SXM4-40GB", gets that size from ``chip_by_name``).
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    "a100": _per_device("a100", 312 * TFLOPS, 80 * GB, lane="cuda"),
    # L4: NVIDIA L4 Tensor Core GPU datasheet, "BF16 Tensor Core 242 teraFLOPS*", the * marking a
    # figure with sparsity, which is twice the dense rate: 121 dense; 24GB GDDR6.
    # https://www.nvidia.com/en-us/data-center/l4/
    "l4": _per_device("l4", 121 * TFLOPS, 24 * GB, lane="cuda"),
    # L40S: NVIDIA L40S datasheet, "BF16 Tensor Core 362.05 | 733*" (* with sparsity): 362.05 is the
    # dense figure (181.05 | 362.1* is the plain L40's row, a different card); 48GB GDDR6.
    # https://www.nvidia.com/en-us/data-center/l40s/
    "l40s": _per_device("l40s", 362.05 * TFLOPS, 48 * GB, lane="cuda"),
    # RTX 4090: "NVIDIA ADA GPU ARCHITECTURE" whitepaper, Appendix A, GeForce RTX 4090 column
    # (dense/sparse): "Peak BF16 Tensor TFLOPS with FP32 Accumulate 165.2/330.4". GeForce cards run
    # fp16 tensor math at 330.3 only with fp16 accumulation; PyTorch's bf16 matmuls accumulate in
    # fp32, so 165.2 (82.6 is the card's non-tensor fp32 and its TF32 tensor rate). 24GB GDDR6X.
    # https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf
    "rtx4090": _per_device("rtx4090", 165.2 * TFLOPS, 24 * GB, lane="cuda"),
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

_GPU_MODELS = ("h100", "h200", "b200", "a100", "l40s", "l4", "rtx4090")
"""GPU models whose product names (``torch.cuda.get_device_name``) add a form factor or memory size."""

_GPU_VARIANT = re.compile(r"sxm|pcie|nvl|hbm|\d+gb")
"""What may follow the model in a product name of that model: ``-SXM4-80GB``, ``80GB PCIe``, ``NVL``.
Anything else (``L40`` after ``L4``, ``RTX 4090 D``, ``RTX 4090 Laptop GPU``) is another product."""

_GPU_MEMORY = re.compile(r"(?<![\w.])(\d+)gb")
"""The memory size a GPU product name states, as a word of its own: ``A100-SXM4-40GB``, ``H100 80GB HBM3``."""


def chip_by_name(name: str) -> ChipSpec:
    """Look a chip up by a loose name: ``v5p``, ``TPU v6e``, ``v5p-128``, ``NVIDIA H100 80GB HBM3``.

    A topology suffix (``-128``) is ignored. A GPU product name that states its memory
    (``NVIDIA A100-SXM4-40GB``) gets that memory. Raises ``KeyError`` naming the known chips.
    """
    key = name.lower()
    for noise in ("nvidia", "geforce", "tpu", " ", "_"):
        key = key.replace(noise, "")
    head, _, tail = key.rpartition("-")
    if head and tail.isdigit():
        key = head
    key = _ALIASES.get(key.replace("-", ""), key.replace("-", ""))
    if key in CHIPS:
        return CHIPS[key]
    for model in _GPU_MODELS:  # product names carry memory size and form factor after the model
        if not key.startswith(model) or not _GPU_VARIANT.match(key, len(model)):
            continue
        if "mig" in key:  # a MIG slice has a fraction of the GPU's peak: let the cuda lane measure it
            break
        memory = _GPU_MEMORY.search(name.lower())
        return replace(CHIPS[model], memory_bytes=int(memory[1]) * GB) if memory else CHIPS[model]
    close = difflib.get_close_matches(key, [*CHIPS, *_ALIASES], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"Unknown chip {name!r}; known chips: {', '.join(CHIPS)}.{hint}")


def host_memory_bytes() -> int:
    """Physical memory of this machine in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def matmul_peak_flops(
    device: torch.device | str,
    dtype: torch.dtype,
    synchronize: Callable[[], None],
    size: int,
    seconds: float,
) -> float:
    """The best FLOP/s of single ``size x size`` matmuls of ``dtype`` on ``device`` over about ``seconds``.

    ``synchronize`` waits for the device (a no-op on a CPU, ``torch.cuda.synchronize`` on a
    GPU): each call is timed from a synchronised start to its synchronised end, after one
    warm-up call. At least one call is timed however short ``seconds`` is. The operands come from a
    generator of their own: measuring leaves the process's random state (CPU and device) as it was.
    """
    import torch

    generator = torch.Generator(device=device).manual_seed(0)  # not the run's: a resumed run draws as it would have
    a = torch.randn(size, size, device=device, generator=generator).to(dtype)
    b = torch.randn(size, size, device=device, generator=generator).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    torch.mm(a, b, out=out)  # warm up: BLAS threads, cuBLAS handles and kernel selection
    synchronize()
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        synchronize()
        elapsed = time.perf_counter() - start
        best = max(best, 2 * size**3 / elapsed)
        if start + elapsed > deadline:
            break
    return best


def cpu_time_matmul_flops(size: int, seconds: float, threads: int) -> float:
    """The best fp32 ``size x size`` matmul rate of one core, by the process's CPU time, times ``threads``.

    A matmul's wall time grows when other processes share the cores; the CPU time its threads are given does
    not (much): FLOPs over the CPU seconds the process spent is the rate of a core while it runs, whatever the
    machine's load. Times ``threads`` (the threads PyTorch runs a matmul on) it is what the matmul gets with
    those cores to itself.
    """
    import torch

    generator = torch.Generator().manual_seed(0)  # not the run's random state
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)  # warm up the BLAS threads
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        started = time.process_time()
        torch.mm(a, b, out=out)
        spent = time.process_time() - started
        if spent > 0:
            best = max(best, 2 * size**3 / spent * threads)
        if time.perf_counter() > deadline:
            return best


def measure_cpu_peak(size: int = 1024, seconds: float = 0.5) -> ChipSpec:
    """Measure this CPU's fp32 matmul rate and return it as a ``ChipSpec``.

    Runs ``size x size`` matmuls for about ``seconds`` on the threads PyTorch uses, timed two ways, and keeps
    the higher: the best wall-clock rate of any single call (what a matmul got), and the best rate by CPU time
    (``cpu_time_matmul_flops``: what it gets with its cores to itself). On an idle machine the two agree; on a
    busy one the wall-clock rate falls with the load and the CPU-time rate does not, so a peak measured then is
    not too low (which would put MFU above 100%).
    """
    import torch

    wall = matmul_peak_flops("cpu", torch.float32, lambda: None, size, seconds / 2)
    threads = max(1, min(torch.get_num_threads(), os.cpu_count() or 1))
    by_cpu_time = cpu_time_matmul_flops(size, seconds / 2, threads)
    return ChipSpec("cpu", max(wall, by_cpu_time), host_memory_bytes(), measured=True, peak_method=CPU_PEAK_METHOD)


def measure_gpu_peak(index: int | None = None, size: int = 8192, seconds: float = 0.5) -> ChipSpec:
    """Measure a CUDA GPU's bf16 matmul rate and return it as a ``ChipSpec`` for the cuda lane.

    For a GPU the chip table does not list: runs ``size x size`` bf16 matmuls on GPU ``index``
    (the current one by default) for about ``seconds`` and keeps the best rate of any single
    call. The spec is named after the device (``torch.cuda.get_device_name``) and holds its
    total memory. A GPU without native bf16 (before Ampere) is measured in fp16, what it would
    train in.
    """
    import torch

    if index is None:
        index = torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(index)
    dtype = torch.bfloat16 if properties.major >= 8 else torch.float16  # bf16 tensor cores came with Ampere
    with torch.cuda.device(index):
        best = matmul_peak_flops(torch.device("cuda", index), dtype, torch.cuda.synchronize, size, seconds)
    return ChipSpec(
        torch.cuda.get_device_name(index),
        best,
        properties.total_memory,
        measured=True,
        auto_lane="cuda",
        peak_method=f"{str(dtype).removeprefix('torch.')} matmul measured on this GPU",
    )
