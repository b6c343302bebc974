"""The manifest of a wheelhouse: what it holds (each wheel's name, version, size, origin), what to install from
it, and what the VM must provide. ``manifest.json`` is read by the installer; ``MANIFEST.txt`` is for people.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_TEXT = "MANIFEST.txt"
WHEELS = "wheels"
"""The folder of the wheelhouse that holds every wheel."""


@dataclass
class Wheel:
    """One wheel of the wheelhouse."""

    file: str
    name: str
    version: str
    bytes: int
    origin: str
    """``titanpod`` (built from this checkout), ``uv.lock`` (a locked release), or how it was made."""


@dataclass
class Provided:
    """A package left out because the VM provides it (installed, or reachable through a local index)."""

    name: str
    locked: str
    """The version in uv.lock, which titanpod is tested with."""
    how: str
    """How to get it onto a VM without it."""
    requires: list[str] = field(default_factory=list)
    """The packages it needs that the wheelhouse leaves out with it (they come with it)."""


@dataclass
class Manifest:
    """Everything the installer needs to know about a wheelhouse."""

    python: str
    platforms: list[str]
    install: list[str]
    """The requirements the installer installs, e.g. ``titanpod-pretrain`` and ``titanpod-device[xla]``."""
    wheels: list[Wheel]
    provided: list[Provided]
    commands: list[str]
    """The console commands the install brings (``titanpod-pretrain``, ...)."""

    @property
    def total_bytes(self) -> int:
        return sum(wheel.bytes for wheel in self.wheels)

    def write(self, folder: Path) -> None:
        """Write ``manifest.json`` and ``MANIFEST.txt`` into ``folder``."""
        data = {**asdict(self), "total_bytes": self.total_bytes}
        (folder / MANIFEST).write_text(json.dumps(data, indent=1) + "\n")
        (folder / MANIFEST_TEXT).write_text(self.text())

    def text(self) -> str:
        """The manifest for a reader: the wheels by size, then what the VM must provide."""
        lines = [
            f"titanpod wheelhouse for CPython {self.python} on {self.platforms[0]}: {len(self.wheels)} wheels, "
            f"{megabytes(self.total_bytes)}",
            "",
            "installs: " + " ".join(self.install),
            "",
            f"{'wheel':<44} {'version':<26} {'size':>9}  origin",
        ]
        for wheel in sorted(self.wheels, key=lambda w: -w.bytes):
            lines.append(f"{wheel.name:<44} {wheel.version:<26} {megabytes(wheel.bytes):>9}  {wheel.origin}")
        lines += ["", "the VM must provide (left out of this wheelhouse):"]
        for package in self.provided:
            extra = f" (with {', '.join(package.requires)})" if package.requires else ""
            lines.append(f"  {package.name} (locked: {package.locked}){extra}: {package.how}")
        return "\n".join(lines) + "\n"


def megabytes(size: int) -> str:
    """``12_345_678`` -> ``'12.3 MB'``."""
    return f"{size / 1e6:.1f} MB"


def wheel_name_version(file: str) -> tuple[str, str]:
    """``'torch_tpu-0.2.0-cp311-cp311-manylinux_2_31_x86_64.whl'`` -> ``('torch-tpu', '0.2.0')``."""
    name, version = file.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def read(folder: Path) -> dict:
    """A wheelhouse's ``manifest.json``."""
    return json.loads((folder / MANIFEST).read_text())
