"""Building one of the package's C++ kernels into a shared library, once per machine, and loading it.

The library is compiled for the machine it runs on (``-march=native``) and kept under
``$XDG_CACHE_HOME/titanpod/native`` (``~/.cache/titanpod/native`` without it), named by a key
over the source, the compiler's identity, the flags and the CPU's features; a later process,
or another rank, loads it in milliseconds. A build writes to a temporary file and renames it,
so processes building at once never load a half-written library.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from titanpod.device import cpu_features

FLAGS = ("-O3", "-std=c++17", "-ffp-contract=fast", "-shared", "-fPIC", "-pthread")
"""Compiler flags every build takes."""
OPTIONAL_FLAGS = (("-march=native", "-fopenmp"), ("-fopenmp",), ("-march=native",), ())
"""Extra flags tried in this order until one set compiles: the CPU's own instructions, and OpenMP (the
``libgomp`` torch has loaded, so the kernel's threads are torch's)."""


def native_cache_dir() -> Path:
    """Where built libraries are kept: ``$XDG_CACHE_HOME/titanpod/native``, else ``~/.cache/titanpod/native``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "titanpod" / "native"


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else the first of ``c++``, ``g++``, ``clang++`` on ``PATH``.

    ``RuntimeError`` when there is none, naming what was looked for.
    """
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    raise RuntimeError(
        "No C++ compiler found (looked for $CXX, c++, g++, clang++); the CPU attention kernel is built on first "
        "use. Install one (e.g. 'apt install g++') or set kernels.attention to 'sdpa'."
    )


def _compiler_identity(cxx: str) -> str:
    done = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).strip()


def library_key(source: Path, cxx: str) -> str:
    """The name a build of ``source`` by ``cxx`` is kept under on this machine."""
    digest = hashlib.sha256(source.read_bytes())
    flags = " ".join([*FLAGS, *(" ".join(extra) for extra in OPTIONAL_FLAGS)])
    for part in (_compiler_identity(cxx), flags, platform.machine(), cpu_features()):
        digest.update(b"\0" + part.encode())
    return f"{source.stem}-{digest.hexdigest()[:20]}"


def _compile(cxx: str, source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    for extra in OPTIONAL_FLAGS:
        done = subprocess.run([cxx, *FLAGS, *extra, str(source), "-o", str(out)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode == 0:
            break
    return done


def shared_library(source: Path, cache_dir: Path | None = None) -> ctypes.CDLL:
    """``source`` (a C++ file) built into a shared library, loaded; built first if this machine has no build.

    ``RuntimeError`` when the compiler is missing or the build fails (with the compiler's message).
    """
    cache_dir = native_cache_dir() if cache_dir is None else cache_dir
    cxx = compiler()
    key = library_key(source, cxx)
    built = cache_dir / f"{key}.so"
    if not built.exists():
        print(f"building {source.name} with {cxx} (once on this machine)...", file=sys.stderr, flush=True)
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            handle, scratch = tempfile.mkstemp(prefix=f"{key}.", suffix=".partial", dir=cache_dir)
        except OSError as error:
            raise RuntimeError(
                f"Cannot write the built {source.name} into {cache_dir} ({error}); point $XDG_CACHE_HOME at a "
                "folder you can write, or set kernels.attention to 'sdpa'."
            ) from error
        os.close(handle)
        try:
            done = _compile(cxx, source, Path(scratch))
            if done.returncode != 0:
                raise RuntimeError(
                    f"Building {source} with {cxx} failed:\n{done.stderr.strip()[-4000:]}\n"
                    "Set $CXX to a C++17 compiler, or set kernels.attention to 'sdpa'."
                )
            os.replace(scratch, built)
        finally:
            Path(scratch).unlink(missing_ok=True)
    return ctypes.CDLL(str(built))
