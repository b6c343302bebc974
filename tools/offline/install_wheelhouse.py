"""Install titanpod on a TPU VM without network, from a wheelhouse built by tools/offline/build_wheelhouse.py.

    python3 WHEELHOUSE/install.py                                  # into ~/titanpod-venv
    python3 WHEELHOUSE/install.py --venv DIR --index-url file:///path/to/local/simple

The wheelhouse carries this file as ``install.py``; the VM needs nothing else. It makes a virtual environment
that sees the VM's own packages (``--system-site-packages``), checks that the VM provides what the wheelhouse
left out (jax, libtpu, numpy, torch: the manifest names them), and installs titanpod with pip from the
wheelhouse alone (``--no-index``), or also from a local index or folder given here. The VM's own jax, libtpu,
numpy and torch stay the ones used: they are pinned to their installed versions, so pip never replaces them.
Standard library only; nothing runs at import.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
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


def install(
    manifest: dict, wheelhouse: Path, python: Path, pip: list[str], pins: dict, args: argparse.Namespace
) -> None:
    """pip install the manifest's requirements: from the wheelhouse (and the given sources), the VM's pinned."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("".join(f"{name}=={version}\n" for name, version in pins.items()))
    command = [*pip, "install", "--isolated", "--disable-pip-version-check", "--no-input", "--only-binary=:all:"]
    command += ["--constraint", constraints.name, "--find-links", str(wheelhouse / "wheels")]
    command += [arg for link in args.find_links for arg in ("--find-links", link)]
    command += ["--index-url", args.index_url] if args.index_url else ["--no-index"]
    print(f"== pip install {' '.join(manifest['install'])}\n   keeping the VM's {', '.join(sorted(pins))}")
    try:
        returncode = subprocess.run([*command, *manifest["install"]], check=False).returncode
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
    install(manifest, wheelhouse, python, pip_command(python, probe["pip"]), pins, args)

    where = run_json(python, CHECK, "titanpod.device", *[name for name in ("jax", "torch") if name in pins])
    print("== installed; imported from:")
    for module, file in where.items():
        print(f"   {module}: {file}")
    bin_dir = python.parent
    print(f"\nRun titanpod from {bin_dir} (or `source {bin_dir}/activate` first), e.g.:")
    print(f"   {bin_dir}/titanpod-pretrain --device.lane xla                # the debug recipe on the TPU, through JAX")
    if "torch-tpu" in manifest["install"]:
        print(f"   {bin_dir}/titanpod-pretrain --device.lane tpu                # through torch_tpu")
    print(f"   commands: {', '.join(manifest['commands'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
