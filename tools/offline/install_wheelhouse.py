"""Install titanpod on a TPU VM without network, from a wheelhouse built by tools/offline/build_wheelhouse.py.

    python3 WHEELHOUSE/install.py                                  # into ~/titanpod-venv
    python3 WHEELHOUSE/install.py --venv DIR --index-url file:///path/to/local/simple

The wheelhouse carries this file as ``install.py``; the VM needs nothing else. It makes a virtual environment
that sees the VM's own packages (``--system-site-packages``), checks that the VM provides what the wheelhouse
left out (jax, libtpu, numpy, torch: the manifest names them), and installs titanpod with pip from the
wheelhouse alone (``--no-index``), or also from a local index or folder given here. The VM's own jax, libtpu,
numpy and torch stay the ones used: they are pinned to their installed versions, so pip never replaces them.

torch_tpu (a wheelhouse built with ``--torch-tpu``) asks for a libtpu newer than many VM images hold. On such a
VM titanpod is installed without it, saying so; ``--torch-tpu-on-older-libtpu`` installs it anyway, without
that one requirement, and reports the VM's libtpu to it in the three parts it reads (see docs/tpu-chip.md, "The
tpu lane on libtpu 0.0.42.1", for what then runs). Standard library only; nothing runs at import.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PROBE = """
import importlib.metadata, importlib.util, json, sys
names = json.loads(sys.argv[1])
found = {}
for name in names:
    try:
        found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        found[name] = None
print(json.dumps({"versions": found, "pip": importlib.util.find_spec("pip") is not None}))
"""
"""Run in the environment: the installed version of each named package, and whether pip imports there."""

CHECK = """
import importlib, json, sys
out = {}
for module in sys.argv[1:]:
    out[module] = getattr(importlib.import_module(module), "__file__", None) or "(namespace)"
print(json.dumps(out))
"""
"""Run in the environment after the install: where each module is imported from."""

LIBTPU_IN_THREE_PARTS = """\"\"\"Installed by titanpod's install.py --torch-tpu-on-older-libtpu: torch_tpu reads
libtpu's version and refuses one of four parts (0.0.42.1); this reports the first three. Delete this file and its .pth
to undo.\"\"\"

import importlib.metadata as _metadata

_version = _metadata.version


def _libtpu_in_three_parts(name):
    found = _version(name)
    return ".".join(found.split(".")[:3]) if name == "libtpu" else found


_metadata.version = _libtpu_in_three_parts
"""
"""A module the environment imports at start (through a ``.pth``) when torch_tpu goes beside an older libtpu."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheelhouse", type=Path, default=Path(__file__).resolve().parent, help="(default: here)")
    parser.add_argument("--venv", type=Path, default=Path.home() / "titanpod-venv", help="default: ~/titanpod-venv")
    parser.add_argument(
        "--find-links", action="append", default=[], help="another folder (or file:// URL) of wheels, e.g. torch's"
    )
    parser.add_argument("--index-url", help="the VM's own package index (a file:// URL); default: none")
    parser.add_argument(
        "--allow-missing", action="append", default=[], help="a left-out package the VM may lack (e.g. libtpu)"
    )
    parser.add_argument(
        "--torch-tpu-on-older-libtpu",
        action="store_true",
        help="install the wheelhouse's torch_tpu even where the VM's libtpu is older than it asks for",
    )
    return parser.parse_args(argv)


def run_json(python: Path, code: str, *args: str) -> dict:
    """Run ``code`` with ``python``; it prints one JSON object."""
    result = subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"error: {python} could not run a check:\n{result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def make_venv(venv: Path) -> Path:
    """A virtual environment at ``venv`` that sees this Python's packages (made unless there); its python."""
    python = venv / "bin" / "python"
    if not (venv / "pyvenv.cfg").exists():
        print(f"== making {venv} (it sees this Python's own packages: jax, libtpu, numpy, torch)")
        command = [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"error: could not make {venv} with {sys.executable} -m venv:\n{result.stderr.strip()}")
    elif "include-system-site-packages = true" not in (venv / "pyvenv.cfg").read_text():
        print(f"note: {venv} does not see {sys.executable}'s packages; jax, libtpu and numpy must be in it")
    return python


def check_provided(manifest: dict, found: dict, args: argparse.Namespace) -> None:
    """Stop, naming each package and how to get it, when the VM lacks something the wheelhouse left out."""
    other_sources = bool(args.find_links or args.index_url)
    missing = []
    for package in manifest["provided"]:
        name = package["name"]
        if found[name] is not None or name in args.allow_missing:
            continue
        if other_sources and name not in {"jax", "jaxlib", "libtpu", "numpy"}:
            print(f"note: {name} is not installed; pip takes it from {args.index_url or args.find_links}")
            continue
        needs = f" (with {', '.join(package['requires'])})" if package["requires"] else ""
        missing.append(f"  {name}{needs}, locked {package['locked']}: {package['how']}")
    if missing:
        raise SystemExit(
            "error: the wheelhouse leaves these out for the VM to provide, and this Python does not have them:\n"
            + "\n".join(missing)
            + "\n(--allow-missing NAME goes on without one, e.g. libtpu on a machine without a TPU)"
        )


def pip_command(python: Path, pip_in_venv: bool) -> list[str]:
    """pip of the environment (the VM's own, seen through its system packages), else this Python's pip."""
    if pip_in_venv:
        return [str(python), "-m", "pip"]
    result = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"error: neither {python} nor {sys.executable} has pip; install the VM's python3-pip package")
    return [sys.executable, "-m", "pip", "--python", str(python)]


def version_parts(version: str) -> tuple[int, ...]:
    """``0.0.42.1`` as ``(0, 0, 42, 1)``: enough to order libtpu's releases."""
    return tuple(int(part) for part in re.findall(r"\d+", version))


def wheel_requirements(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of ``wheel``'s metadata."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    return [line.partition(":")[2].strip() for line in lines if line.startswith("Requires-Dist:")]


def libtpu_floor(requirements: list[str]) -> str | None:
    """The version in a ``libtpu>=VERSION`` requirement among ``requirements``, else None."""
    for requirement in requirements:
        found = re.fullmatch(r"libtpu\s*>=\s*([\d.]+)", requirement.partition(";")[0].strip())
        if found:
            return found.group(1)
    return None


def torch_tpu_plan(manifest: dict, wheelhouse: Path, pins: dict, args: argparse.Namespace) -> list[str] | None:
    """What to install before torch_tpu, when it must go in without its libtpu requirement (``[]`` when it must
    stay out); None when the manifest's requirements install as they are."""
    wheels = sorted((wheelhouse / "wheels").glob("torch_tpu-*.whl"))
    if "torch-tpu" not in manifest["install"] or "libtpu" not in pins or not wheels:
        return None
    requirements = wheel_requirements(wheels[-1])
    floor = libtpu_floor(requirements)
    if floor is None or version_parts(pins["libtpu"]) >= version_parts(floor):
        return None
    asks = f"{wheels[-1].name.split('-')[1]} asks for libtpu>={floor}; this VM has libtpu {pins['libtpu']}"
    if not args.torch_tpu_on_older_libtpu:
        print(f"note: torch_tpu {asks}. titanpod goes in without torch_tpu (the xla lane runs on the VM's libtpu). "
              "Install a newer libtpu into the environment, or run again with --torch-tpu-on-older-libtpu to put "
              "torch_tpu beside this one (docs/tpu-chip.md says what then runs)")  # fmt: skip
        return []
    print(f"note: torch_tpu {asks}: it goes in without that requirement, and the environment reports libtpu's "
          "version to it in three parts. torch_tpu's own Pallas kernels (its SDPA) may not compile on this libtpu: "
          "a run on titanpod's tpu lane then asks for --kernels.attention math")  # fmt: skip
    return [requirement for requirement in requirements if not requirement.startswith("libtpu")]


def report_libtpu_in_three_parts(python: Path) -> None:
    """Make ``python``'s environment report libtpu's version in three parts at every start (a ``.pth``)."""
    site = Path(run_json(python, "import json, sysconfig; print(json.dumps(sysconfig.get_paths()))")["purelib"])
    (site / "titanpod_libtpu_in_three_parts.py").write_text(LIBTPU_IN_THREE_PARTS)
    (site / "titanpod_libtpu_in_three_parts.pth").write_text("import titanpod_libtpu_in_three_parts\n")


def install(
    requirements: list[str],
    wheelhouse: Path,
    pip: list[str],
    pins: dict,
    args: argparse.Namespace,
    no_deps: bool = False,
) -> None:
    """pip install ``requirements``: from the wheelhouse (and the given sources), the VM's pinned."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("".join(f"{name}=={version}\n" for name, version in pins.items()))
    command = [*pip, "install", "--isolated", "--disable-pip-version-check", "--no-input", "--only-binary=:all:"]
    command += ["--constraint", constraints.name, "--find-links", str(wheelhouse / "wheels")]
    command += [arg for link in args.find_links for arg in ("--find-links", link)]
    command += ["--index-url", args.index_url] if args.index_url else ["--no-index"]
    command += ["--no-deps"] if no_deps else []
    print(f"== pip install {' '.join(requirements)}\n   keeping the VM's {', '.join(sorted(pins))}")
    try:
        returncode = subprocess.run([*command, *requirements], check=False).returncode
    finally:
        Path(constraints.name).unlink()
    if returncode != 0:
        raise SystemExit(
            "error: pip could not install from the wheelhouse (its message is above). A package it names as not "
            "found is one the VM must provide: pass the folder or index holding it with --find-links or "
            "--index-url; a conflict with a pinned package means the VM's version is not one titanpod accepts"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wheelhouse = args.wheelhouse.resolve()
    if not (wheelhouse / "manifest.json").is_file():
        raise SystemExit(f"error: {wheelhouse} is not a wheelhouse (no manifest.json): build one with "
                         "tools/offline/build_wheelhouse.py and run its own install.py")  # fmt: skip
    absent = [link for link in args.find_links if "://" not in link and not Path(link).is_dir()]
    if absent:
        raise SystemExit(f"error: --find-links {absent[0]} is not a folder; nothing was installed")
    manifest = json.loads((wheelhouse / "manifest.json").read_text())
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != manifest["python"] or platform.machine() not in manifest["platforms"][0]:
        raise SystemExit(
            f"error: the wheelhouse is for CPython {manifest['python']} on {manifest['platforms'][0]}, this is "
            f"{here} on {platform.machine()}: run install.py with the VM's python{manifest['python']}, or build "
            f"the wheelhouse with --python {here}"
        )
    python = make_venv(args.venv.resolve())
    names = [package["name"] for package in manifest["provided"]]
    probe = run_json(python, PROBE, json.dumps(names))
    check_provided(manifest, probe["versions"], args)
    pins = {name: version for name, version in probe["versions"].items() if version is not None}
    pip = pip_command(python, probe["pip"])
    before_torch_tpu = torch_tpu_plan(manifest, wheelhouse, pins, args)
    if before_torch_tpu is None:
        install(manifest["install"], wheelhouse, pip, pins, args)
    else:
        install([r for r in manifest["install"] if r != "torch-tpu"] + before_torch_tpu, wheelhouse, pip, pins, args)
        if before_torch_tpu:
            report_libtpu_in_three_parts(python)
            install(["torch-tpu"], wheelhouse, pip, pins, args, no_deps=True)

    where = run_json(python, CHECK, "titanpod.device", *[name for name in ("jax", "torch") if name in pins])
    print("== installed; imported from:")
    for module, file in where.items():
        print(f"   {module}: {file}")
    bin_dir = python.parent
    print(f"\nRun titanpod from {bin_dir} (or `source {bin_dir}/activate` first), e.g.:")
    print(f"   {bin_dir}/titanpod-pretrain --device.lane xla                # the debug recipe on the TPU, through JAX")
    if "torch-tpu" in manifest["install"] and before_torch_tpu != []:
        print(f"   {bin_dir}/titanpod-pretrain --device.lane tpu                # through torch_tpu")
    print(f"   commands: {', '.join(manifest['commands'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
