"""Build, on a machine that reaches PyPI, the folder a TPU VM without network installs titanpod from.

    python3 tools/offline/build_wheelhouse.py WHEELHOUSE                  # CPython 3.11, manylinux x86_64
    python3 tools/offline/build_wheelhouse.py WHEELHOUSE --torch-tpu      # and torch_tpu, torch 2.13's glue only

WHEELHOUSE gets ``wheels/`` (titanpod's distributions built from this checkout, and the third-party wheels
they need at the versions of ``uv.lock``), ``manifest.json`` and ``MANIFEST.txt`` (each wheel's version
and size, and what the VM must provide), and ``install.py``, the installer to run on the VM:
``python3 WHEELHOUSE/install.py``. Left out, since the VM provides them: jax, jaxlib, libtpu and numpy
(with what only they need), and by default torch (``--torch cpu`` or ``--torch-from`` adds torch's CPU
build). No ``nvidia-*``, ``cuda-*`` or ``triton`` wheel is ever put in. Needs uv and network; nothing
runs at import.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from lock_requirements import (
    CUDA_STACK,
    REPO,
    Pin,
    lock_closure,
    locked_for_target,
    member_extras,
    third_party_pins,
    uv_executable,
)
from target_markers import Target
from torch_tpu_glue import keep_one_release
from wheelhouse_manifest import WHEELS, Manifest, Provided, Wheel, megabytes, wheel_name_version

INSTALLER = Path(__file__).with_name("install_wheelhouse.py")
"""Copied into the wheelhouse as ``install.py``: the VM needs nothing but the wheelhouse."""

VM_PROVIDES = {
    "jax": "preinstalled on TPU VM images; elsewhere `pip install jax[tpu]` where an index can be reached",
    "jaxlib": "comes with jax",
    "libtpu": "preinstalled on TPU VM images; comes with `jax[tpu]`",
    "numpy": "comes with jax",
}
"""Left out of every wheelhouse: a TPU VM's image has them, matched to its TPU software."""

TORCH_HOW = (
    "install torch's CPU build on the VM, or pass the folder (or local index) holding its wheel to install.py "
    "with --find-links (or --index-url), or build the wheelhouse with --torch cpu"
)
VM_INDEX_HOW = "from the VM's own package index: pass it to install.py with --index-url (or --find-links)"
DEFAULT_EXTRAS = ["xla", "pallas"]
"""The xla lane (torchax, Orbax checkpoints) and the Pallas kernels: what a TPU VM runs without torch_tpu."""


def manylinux_platforms(glibc: str, machine: str) -> list[str]:
    """Every manylinux tag a VM with ``glibc`` runs, newest first: ``2.31`` -> ``manylinux_2_31_x86_64``, ..."""
    major, minor = (int(part) for part in glibc.split("."))
    if major != 2 or minor < 17:
        raise SystemExit(f"error: --glibc {glibc}: give the VM's glibc release, 2.17 or later (e.g. 2.31, 2.35)")
    return [f"manylinux_2_{m}_{machine}" for m in range(minor, 16, -1)] + [f"manylinux2014_{machine}"]


def pip_command() -> list[str]:
    """pip of this Python, else pip run by uv."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    return [uv_executable(), "tool", "run", "pip"]


def download(pins: list[Pin], target: Target, platforms: list[str], folder: Path, index: str | None = None) -> None:
    """Download the wheel of each pin for ``target`` (never a source distribution) into ``folder``."""
    if not pins:
        return
    command = [*pip_command(), "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(folder)]
    command += ["--python-version", target.python, "--implementation", "cp"]
    command += [arg for platform in platforms for arg in ("--platform", platform)]
    command += ["--index-url", index] if index else []
    result = subprocess.run(command + [str(pin) for pin in pins], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(
            f"error: pip could not download every wheel for CPython {target.python} on {platforms[0]}:\n"
            f"{result.stderr.strip()}\n(a package without such a wheel cannot be installed on the VM; "
            "a VM with a newer glibc may take --glibc 2.35)"
        )


def build_own_wheels(folder: Path) -> None:
    """Build every titanpod distribution of this checkout as a wheel into ``folder``."""
    command = [uv_executable(), "build", "--all-packages", "--wheel", "--no-build-logs", "--out-dir", str(folder)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"error: uv build failed:\n{result.stderr.strip()}")
    (folder / ".gitignore").unlink(missing_ok=True)


def add_torch(args: argparse.Namespace, version: str, target: Target, platforms: list[str], folder: Path) -> str:
    """Put torch's CPU build (from ``--torch-from`` or the CPU index) into ``folder``; returns its origin."""
    if args.torch_from:
        wheels = sorted(Path(args.torch_from).glob(f"torch-{version}+cpu-cp{target.python.replace('.', '')}-*.whl"))
        if not wheels:
            raise SystemExit(
                f"error: {args.torch_from} holds no torch-{version}+cpu wheel for CPython {target.python}; "
                f"download it from {args.torch_index}/torch/"
            )
        shutil.copy2(wheels[0], folder / wheels[0].name)
        return f"CPU build, from {args.torch_from}"
    download([Pin("torch", f"{version}+cpu")], target, platforms, folder, index=args.torch_index)
    return f"CPU build, from {args.torch_index}"


def add_torch_tpu(version: str, torch_version: str, target: Target, folder: Path, have: set[str]) -> list[Pin]:
    """Put torch_tpu ``version`` (torch ``torch_version``'s glue only) into ``folder``; returns the locked
    packages it needs that are not yet there (from envs/tpu's lock)."""
    with tempfile.TemporaryDirectory() as temporary:
        download([Pin("torch-tpu", version)], target, manylinux_platforms("2.31", target.machine), Path(temporary))
        (original,) = Path(temporary).glob("torch_tpu-*.whl")
        minor = int(torch_version.split(".")[1])
        kept, dropped = keep_one_release(original, folder / original.name, minor)
        print(f"torch_tpu {version}: kept torch 2.{minor}'s glue; {dropped} of {kept + dropped} files dropped")
    return torch_tpu_needs(target, have)


def torch_tpu_needs(target: Target, have: set[str]) -> list[Pin]:
    """What torch_tpu needs on ``target`` (pinned by envs/tpu's lock), without what the VM provides (torch too)
    and without ``have``, the packages the wheelhouse holds or leaves to the VM's index already."""
    stop = set(VM_PROVIDES) | {"torch"} | have
    needs = lock_closure(REPO / "envs/tpu/uv.lock", "torch-tpu", target, stop)
    return [pin for pin in needs if pin.name != "torch-tpu"]


def install_requirements(packages: list[str], extras: list[str]) -> list[str]:
    """Each chosen distribution with the chosen extras it offers: ``titanpod-device[xla]``."""
    offered = member_extras()
    lines = []
    for name in packages:
        mine = [extra for extra in extras if extra in offered[name]]
        lines.append(f"{name}[{','.join(mine)}]" if mine else name)
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheelhouse", type=Path, help="the folder to write (made empty first)")
    parser.add_argument("--python", default="3.11", help="the VM's Python release (default: 3.11)")
    parser.add_argument("--glibc", default="2.31", help="the VM's glibc release, for manylinux wheels (default: 2.31)")
    parser.add_argument("--machine", default="x86_64", help="the VM's machine (default: x86_64)")
    parser.add_argument(
        "--package", action="append", help="a titanpod distribution to install on the VM (default: all of them)"
    )
    parser.add_argument(
        "--extras",
        default=",".join(DEFAULT_EXTRAS),
        help=f"comma-separated extras of the distributions that offer them (default: {','.join(DEFAULT_EXTRAS)}; "
        "'' for none; e.g. xla,pallas,hf adds transformers)",
    )
    parser.add_argument(
        "--torch",
        choices=["vm", "cpu"],
        default="vm",
        help="vm: the VM provides torch (default); cpu: add its CPU build",
    )
    parser.add_argument("--torch-from", help="a folder holding torch's CPU wheel (implies --torch cpu)")
    parser.add_argument("--torch-index", default="https://download.pytorch.org/whl/cpu", help="the index of CPU builds")
    parser.add_argument(
        "--vm-has",
        default="",
        help="comma-separated packages the VM's own package index holds: left out with what only they need "
        "(e.g. datasets,tensorstore,matplotlib); install.py then takes them from --index-url or --find-links",
    )
    parser.add_argument("--torch-tpu", nargs="?", const="0.2.0", help="add torch_tpu (default 0.2.0), one glue only")
    args = parser.parse_args(argv)
    args.extras = [extra for extra in args.extras.split(",") if extra]
    args.vm_has = [re.sub(r"[-_.]+", "-", name.strip().lower()) for name in args.vm_has.split(",") if name.strip()]
    if "tpu" in args.extras:
        parser.error("the tpu extra is torch_tpu: pass --torch-tpu instead, which keeps one torch release's glue")
    offered = member_extras()
    unknown = [name for name in args.package or [] if name not in offered]
    if unknown:
        parser.error(f"no titanpod distribution named {', '.join(unknown)}; choose from {', '.join(offered)}")
    args.package = args.package or list(offered)
    if args.torch_from:
        args.torch = "cpu"
    return args


def collect(args: argparse.Namespace, target: Target, platforms: list[str], wheels: Path) -> dict[str, str]:
    """Build and download every wheel into ``wheels``; returns each third-party package's origin."""
    build_own_wheels(wheels)
    with_torch = args.torch == "cpu"
    leave_out = [*VM_PROVIDES, *args.vm_has]
    pins = third_party_pins(args.package, args.extras, leave_out, target, torch_included=with_torch)
    origins = {pin.name: "uv.lock" for pin in pins}
    download([pin for pin in pins if pin.name != "torch"], target, platforms, wheels)
    torch_version = locked_for_target(target)["torch"]
    if with_torch:
        origins["torch"] = add_torch(args, torch_version, target, platforms, wheels)
    if args.torch_tpu:
        more = add_torch_tpu(args.torch_tpu, torch_version, target, wheels, set(origins) | set(args.vm_has))
        download(more, target, platforms, wheels)
        origins.update({pin.name: "envs/tpu/uv.lock (for torch_tpu)" for pin in more})
        origins["torch-tpu"] = f"PyPI, repacked with torch {torch_version}'s glue only"
    return origins


def listed(wheels: Path, origins: dict[str, str]) -> list[Wheel]:
    """The wheels in ``wheels``, checked: one for each package meant to be there, none of the CUDA stack."""
    found = []
    for file in sorted(wheels.glob("*.whl")):
        name, version = wheel_name_version(file.name)
        if CUDA_STACK.match(name):
            raise SystemExit(f"error: {file.name} is a CUDA package; a wheelhouse for a TPU VM never holds one")
        found.append(Wheel(file.name, name, version, file.stat().st_size, origins.get(name, "titanpod")))
    missing = sorted(set(origins) - {wheel.name for wheel in found})
    if missing:
        raise SystemExit(f"error: no wheel came for {', '.join(missing)}")
    return found


def provided(target: Target, torch_included: bool, vm_has: list[str]) -> list[Provided]:
    """What the VM must provide: VM_PROVIDES, what its index has, and torch (with its own requirements) unless it
    is included."""
    locked = locked_for_target(target)
    found = [Provided(name, locked.get(name, ""), how) for name, how in VM_PROVIDES.items()]
    found += [Provided(name, locked.get(name, ""), VM_INDEX_HOW) for name in vm_has]
    if not torch_included:
        needs = third_party_pins(["titanpod-device"], [], [], target, torch_included=True)
        found.append(Provided("torch", locked["torch"], TORCH_HOW, [pin.name for pin in needs if pin.name != "torch"]))
    return found


def console_commands(packages: list[str]) -> list[str]:
    """The console commands the chosen distributions declare (``[project.scripts]``)."""
    commands = []
    for pyproject in sorted(REPO.glob("*/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") in packages:
            commands += list(project.get("scripts", {}))
    return sorted(commands)


def check_vm_has(names: list[str], locked: dict[str, str]) -> None:
    """Refuse a ``--vm-has`` name the lock does not hold: a misspelt one would leave nothing out, silently."""
    for name in names:
        if name not in locked:
            close = difflib.get_close_matches(name, list(locked), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SystemExit(f"error: --vm-has names {name!r}, which titanpod's lock does not hold{hint}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = Target(args.python, args.machine)
    check_vm_has(args.vm_has, locked_for_target(target))
    platforms = manylinux_platforms(args.glibc, args.machine)
    out = args.wheelhouse.resolve()
    if out.exists():
        shutil.rmtree(out)
    (out / WHEELS).mkdir(parents=True)
    origins = collect(args, target, platforms, out / WHEELS)
    manifest = Manifest(
        python=target.python,
        platforms=platforms,
        install=install_requirements(args.package, args.extras) + (["torch-tpu"] if args.torch_tpu else []),
        wheels=listed(out / WHEELS, origins),
        provided=provided(target, args.torch == "cpu", args.vm_has),
        commands=console_commands(args.package),
    )
    manifest.write(out)
    shutil.copy2(INSTALLER, out / "install.py")
    print(manifest.text(), end="")
    print(f"\nwrote {out}: {megabytes(manifest.total_bytes)} of wheels. On the VM: python3 {out}/install.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
