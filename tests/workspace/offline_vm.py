"""A stand-in for a TPU VM without network, for the tests of tools/offline.

The VM's own packages (jax, jaxlib, numpy, torch and what they need) are this test environment's, linked
into a folder of their own: a virtual environment whose ``.pth`` file adds that folder sees them as a
TPU VM's Python sees its preinstalled packages, and nothing else of this environment (titanpod's own
layers and the rest of the third-party packages are not there).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[2]
OFFLINE_TOOLS = REPO_ROOT / "tools" / "offline"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: list[str]) -> set[str]:
    """``names`` and every distribution they require here (with the extras each requirement asks for)."""
    found: set[tuple[str, str]] = set()
    waiting = [(normalized(name), "") for name in names]
    while waiting:
        name, extra = waiting.pop()
        if (name, extra) in found:
            continue
        found.add((name, extra))
        for line in importlib.metadata.distribution(name).requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                child = normalized(requirement.name)
                waiting += [(child, "")] + [(child, wanted) for wanted in requirement.extras]
    return {name for name, _ in found}


def link_packages(names: list[str], folder: Path) -> None:
    """Link every file of the named distributions (and what they require) from this environment into ``folder``."""
    folder.mkdir(parents=True)
    for name in sorted(closure(names)):
        distribution = importlib.metadata.distribution(name)
        tops = {file.parts[0] for file in distribution.files or [] if file.parts[0] != ".."}
        for top in tops:
            source = Path(distribution.locate_file(top))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)


def make_vm(tmp_path: Path, provides: list[str]) -> Path:
    """A virtual environment (with pip) whose Python sees only ``provides`` of this environment; its python."""
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to make a fresh environment (run the suite with `uv run pytest`)"
    venv = tmp_path / "vm"
    subprocess.run([uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(venv)], check=True, timeout=300)
    link_packages(provides, tmp_path / "vm-packages")
    (site_packages(venv) / "_vm_packages.pth").write_text(f"{tmp_path / 'vm-packages'}\n")
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    """The environment's own site-packages folder."""
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def build_wheelhouse(out: Path, *flags: str, timeout: float = 900) -> dict:
    """Run the builder into ``out``; it must succeed. Its manifest."""
    result = subprocess.run(
        [sys.executable, str(OFFLINE_TOOLS / "build_wheelhouse.py"), str(out), *flags],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / "manifest.json").read_text())


def install(python: Path, wheelhouse: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run the wheelhouse's ``install.py`` with ``python`` into that Python's own environment (no network)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "VIRTUAL_ENV"))}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return subprocess.run(
        [str(python), str(wheelhouse / "install.py"), "--venv", str(python.parent.parent), *flags],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )  # fmt: skip
