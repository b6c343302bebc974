"""The third-party packages a wheelhouse holds, pinned to ``uv.lock``, without what the TPU VM provides.

``uv export`` walks the lock from titanpod's distributions (with the chosen extras) and ``--prune`` drops a
package the VM provides together with what only it needs (scipy and opt-einsum come with the VM's jax); the
markers of what is left are evaluated for the VM's Python and platform, not for this machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from target_markers import Target, evaluate

REPO = Path(__file__).resolve().parents[2]

CUDA_STACK = re.compile(r"^(nvidia-|cuda-|triton$)")
"""PyPI torch's CUDA packages: never in a wheelhouse (the VM has no GPU, and torch's CPU build needs none)."""


@dataclass(frozen=True)
class Pin:
    """One locked package: ``name==version``."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def uv_executable() -> str:
    """The ``uv`` on PATH; the wheelhouse is built from the lock with it."""
    found = shutil.which("uv")
    if not found:
        raise SystemExit("error: uv is not installed; install it (https://docs.astral.sh/uv/), e.g. 'pip install uv'")
    return found


def member_extras(repo: Path = REPO) -> dict[str, list[str]]:
    """titanpod's distributions (every package and app of the workspace) and the extras each offers."""
    members = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
    found = {}
    for pyproject in sorted(path for pattern in members for path in repo.glob(f"{pattern}/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        found[project["name"]] = sorted(project.get("optional-dependencies", {}))
    return found


def locked_versions(repo: Path = REPO) -> dict[str, set[str]]:
    """Every locked package's versions (a package locked for two Python ranges has two)."""
    versions: dict[str, set[str]] = {}
    for package in tomllib.loads((repo / "uv.lock").read_text())["package"]:
        versions.setdefault(package["name"], set()).add(package.get("version", ""))
    return versions


def cuda_stack(repo: Path = REPO) -> list[str]:
    """The lock's ``nvidia-*``, ``cuda-*`` and ``triton`` packages."""
    return sorted(name for name in locked_versions(repo) if CUDA_STACK.match(name))


def export_lines(packages: list[str], extras: list[str], prune: list[str], repo: Path = REPO) -> list[str]:
    """``uv export``'s requirement lines for ``packages`` with ``extras``, without ``prune`` and what only it needs."""
    command = [uv_executable(), "export", "--locked", "--no-dev", "--no-hashes", "--no-header", "--no-annotate"]
    command += ["--format", "requirements-txt", "--no-emit-workspace"]
    command += [arg for name in packages for arg in ("--package", name)]
    command += [arg for name in extras for arg in ("--extra", name)]
    command += [arg for name in prune for arg in ("--prune", name)]
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"error: uv export failed (is uv.lock up to date? run 'uv lock'):\n{result.stderr.strip()}")
    return [line.strip() for line in result.stdout.splitlines() if line.strip() and not line.startswith("#")]


def locked_for_target(target: Target, repo: Path = REPO) -> dict[str, str]:
    """The version of each package the lock holds for ``target``: every distribution, every extra."""
    members = member_extras(repo)
    extras = sorted({extra for offered in members.values() for extra in offered})
    return {pin.name: pin.version for pin in pins_for_target(export_lines(list(members), extras, [], repo), target)}


def pins_for_target(lines: list[str], target: Target) -> list[Pin]:
    """The ``name==version`` lines whose markers hold on ``target``."""
    pins = []
    for line in lines:
        requirement, _, marker = line.partition(";")
        if marker.strip() and not evaluate(marker.strip(), target):
            continue
        name, sep, version = requirement.strip().partition("==")
        if not sep:
            raise ValueError(f"uv export wrote {line!r}, not a pinned name==version")
        pins.append(Pin(name.strip().lower(), version.strip()))
    return sorted(pins, key=lambda pin: pin.name)


def third_party_pins(
    packages: list[str], extras: list[str], provided: list[str], target: Target, torch_included: bool
) -> list[Pin]:
    """The locked third-party packages ``packages`` need on ``target``, without ``provided`` (and what only they
    need) and without torch's CUDA stack; torch itself stays in only when ``torch_included``."""
    prune = list(provided) + cuda_stack()
    if not torch_included:
        prune.append("torch")
    pins = pins_for_target(export_lines(packages, extras, prune), target)
    return [pin for pin in pins if not CUDA_STACK.match(pin.name)]


def lock_closure(lock_file: Path, root: str, target: Target, stop: set[str]) -> list[Pin]:
    """``root`` and what it needs on ``target``, read from ``lock_file``, not descending into ``stop``."""
    packages: dict[str, list[dict]] = {}
    for package in tomllib.loads(lock_file.read_text())["package"]:
        packages.setdefault(package["name"], []).append(package)
    if root not in packages:
        raise SystemExit(f"error: {lock_file} locks no {root}")
    found: dict[str, Pin] = {}
    waiting = [(root, None)]
    while waiting:
        name, version = waiting.pop()
        if name in stop or name in found:
            continue
        package = next(p for p in packages[name] if version is None or p["version"] == version)
        found[name] = Pin(name, package["version"])
        for dependency in package.get("dependencies", []):
            if evaluate(dependency.get("marker", "python_version >= '3'"), target):
                waiting.append((dependency["name"], dependency.get("version")))
    return sorted(found.values(), key=lambda pin: pin.name)
