"""Looks at the machine without importing an accelerator stack: installed packages through
``importlib.util.find_spec``, devices through the file system (and PyTorch's CUDA count)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

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


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (``libtpu``), from its metadata; ``None`` when not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
