"""Shared set-up of the tpu conformance tests: a chip-less host made to look like one v5p host.

libtpu reads the TPU VM's variables at its first use and, where they are missing, asks the cloud
metadata server (30 tries) before giving up; set here, it never asks. torch_tpu registers the
``tpu`` device only where its PCI scan finds chips: the ``tpu_backend`` fixture stands in for that
scan (4 chips, as a v5p host has) and leaves everything after it to torch_tpu's own loader.
"""

from __future__ import annotations

import os

import pytest

TPU_VM_ENVIRONMENT = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5p-8",
    "TPU_WORKER_ID": "0",
    "TPU_WORKER_HOSTNAMES": "localhost",
    # Only compiling here: a second process loading libtpu beside another's compile is harmless.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
"""What a v5p-8 VM sets; the chip table reads the generation from ``TPU_ACCELERATOR_TYPE``."""

CHIPS_ON_HOST = 4
"""What torch_tpu's PCI scan would find on a v5p host."""

for _name, _value in TPU_VM_ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)


def pretend_chips_are_attached(count: int = CHIPS_ON_HOST) -> None:
    """Make torch_tpu's PCI scan report ``count`` chips (the one thing a chip-less host cannot give it)."""
    from torch_tpu._internal.utils import hardware

    hardware.get_tpu_device_count = lambda: count


@pytest.fixture(scope="session")
def tpu_backend():
    """titanpod's tpu lane, registered through torch_tpu's loader (autoload is off in these tests)."""
    from titanpod.device.backends.tpu import TpuBackend

    pretend_chips_are_attached()
    return TpuBackend()


def compile_in_fresh_process(recipe, folder, *flags: str, app: str = "titanpod.pretrain.cli") -> dict:
    """``titanpod-pretrain --recipe <recipe as a file> --compile-for ...`` in a fresh interpreter (torchax, which
    the xla step uses, cannot register its device once a test here has registered torch_tpu's); its exit code and
    report.json (``exit`` added). ``flags`` name the slice and anything else, e.g. ``--compile-for v5p-8``;
    ``app`` is the command's module (``titanpod.diffusion.cli`` for a diffusion recipe)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    recipe_file = folder / "recipe.json"
    recipe_file.write_text(recipe.to_json())
    done = subprocess.run(
        [sys.executable, "-m", app, "--recipe", str(recipe_file), *flags,
         "--compile-output", str(folder / "compiled")],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )  # fmt: skip
    report_file = folder / "compiled" / "report.json"
    if done.returncode not in (0, 1) or not report_file.exists():
        raise AssertionError(
            f"the compile failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return {**json.loads(report_file.read_text()), "exit": done.returncode}
