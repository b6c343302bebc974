"""Lane names and the rule that picks one.

A lane is a way of running PyTorch: ``cpu``, ``cuda``, ``xla`` (torchax on JAX), ``tpu``
(torch_tpu) or ``torch_xla`` (legacy). Everything here only *looks* at the machine:
it finds installed packages with ``importlib.util.find_spec`` and devices through the
file system, so nothing imports jax, torch_tpu or torch_xla.

Which lane runs, first match wins:

1. the lane named in the run's config (``DeviceConfig.lane``), unless it is ``auto``;
2. the ``TITANPOD_LANE`` environment variable, unless unset, empty or ``auto``;
3. automatic: ``tpu`` if torch_tpu is installed and a TPU is attached, then
   ``torch_xla`` if torch_xla is installed and a TPU is attached, then ``cuda`` if
   PyTorch sees a CUDA device, else ``cpu``. The ``xla`` lane is never picked
   automatically: ask for it.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from titanpod.device.errors import LaneUnavailableError

LANES: tuple[str, ...] = ("cpu", "cuda", "xla", "tpu", "torch_xla")
"""Every lane the shim knows, in the order of DESIGN.md's lane table."""

AUTO = "auto"
LANE_ENV_VAR = "TITANPOD_LANE"

_GOOGLE_PCI_VENDOR = "0x1ae0"


def module_installed(name: str) -> bool:
    """True when ``name`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def tpu_attached(sys_root: Path = Path("/")) -> bool:
    """True when this machine has a TPU: a ``/dev/accel*`` node or a Google PCI device.

    ``sys_root`` lets tests point the probe at a fake file system.
    """
    if any((sys_root / "dev").glob("accel[0-9]*")):
        return True
    pci = sys_root / "sys" / "bus" / "pci" / "devices"
    try:
        for device in pci.iterdir():
            try:
                if (device / "vendor").read_text().strip() == _GOOGLE_PCI_VENDOR:
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def cuda_visible() -> bool:
    """True when PyTorch sees at least one CUDA device."""
    import torch

    return torch.cuda.is_available()


def check_lane_name(name: str) -> str:
    """Return ``name`` normalised, or raise ``ValueError`` naming the closest lane."""
    normalised = name.strip().lower().replace("-", "_")
    if normalised in LANES or normalised == AUTO:
        return normalised
    close = difflib.get_close_matches(normalised, (*LANES, AUTO), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"Unknown lane {name!r}; choose one of {', '.join((*LANES, AUTO))}.{hint}")


def unavailable_reason(lane: str) -> str | None:
    """Why ``lane`` cannot run here, with the fix; ``None`` when it can."""
    if lane == "cpu":
        return None
    if lane == "cuda":
        if cuda_visible():
            return None
        import torch

        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (
            f"lane 'cuda' needs a CUDA GPU, but PyTorch {torch.__version__} ({build}) sees none. "
            "Check nvidia-smi and CUDA_VISIBLE_DEVICES, or choose another lane (TITANPOD_LANE=cpu)."
        )
    if lane == "xla":
        missing = [m for m in ("jax", "torchax") if not module_installed(m)]
        if not missing:
            return None
        return (
            f"lane 'xla' needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            "not installed. Install them with: pip install 'titanpod-device[xla]' "
            "(in this repository: uv sync)."
        )
    if lane == "tpu":
        if not module_installed("torch_tpu"):
            return (
                "lane 'tpu' needs torch_tpu, which is not installed. On a TPU VM install the tpu "
                "environment: uv sync --locked --project envs/tpu (or pip install 'titanpod-device[tpu]'). "
                "Do not install it where there is no TPU: without libtpu, `import torch` fails."
            )
        if not tpu_attached():
            return (
                "lane 'tpu' needs a TPU, but none is attached to this machine "
                "(no /dev/accel* node and no Google PCI device). Run on a TPU VM, or choose "
                "another lane (TITANPOD_LANE=cpu)."
            )
        return None
    if lane == "torch_xla":
        if module_installed("torch_xla"):
            return None
        return (
            "lane 'torch_xla' needs torch_xla, which is not installed. It is the legacy TPU "
            "path: pip install torch_xla built for your PyTorch version, or prefer lane 'tpu'."
        )
    raise ValueError(check_lane_name(lane))


def auto_lane() -> str:
    """The lane the automatic order picks on this machine (see the module docstring)."""
    tpu = tpu_attached()
    if tpu and module_installed("torch_tpu"):
        return "tpu"
    if tpu and module_installed("torch_xla"):
        return "torch_xla"
    if cuda_visible():
        return "cuda"
    return "cpu"


def resolve_lane(requested: str = AUTO, environ: Mapping[str, str] | None = None) -> str:
    """Pick the lane to run: the config's, else ``TITANPOD_LANE``, else automatic.

    Raises ``LaneUnavailableError`` when the chosen lane cannot run here, and
    ``ValueError`` for a name that is not a lane.
    """
    env = os.environ if environ is None else environ
    lane = check_lane_name(requested or AUTO)
    source = "the run's config (device.lane)"
    if lane == AUTO:
        from_env = env.get(LANE_ENV_VAR, "").strip()
        lane = check_lane_name(from_env) if from_env else AUTO
        source = f"the {LANE_ENV_VAR} environment variable"
    if lane == AUTO:
        return auto_lane()
    reason = unavailable_reason(lane)
    if reason is not None:
        raise LaneUnavailableError(f"{reason} (lane {lane!r} was asked for by {source})")
    return lane
