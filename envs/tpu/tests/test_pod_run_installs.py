"""The tpu environment holds what a pod run uses: every app's command, gcsfs for ``--checkpoint.dir gs://...``,
and transformers for the diffusion app's text encoders. Nothing here touches the network."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

COMMANDS = {
    "titanpod-pretrain": "titanpod.pretrain.cli:main",
    "titanpod-convert": "titanpod.pretrain.convert:main",
    "titanpod-posttrain": "titanpod.posttrain.cli:main",
    "titanpod-diffusion": "titanpod.diffusion.cli:main",
    "titanpod-launch": "titanpod.runs.pod_launch.cli:main",
}
"""Each command a pod host runs, and the function it calls."""


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_app_command_is_installed_and_its_module_imports(command):
    (script,) = entry_points(group="console_scripts", name=command)
    assert script.value == COMMANDS[command]
    assert callable(script.load())


def test_gs_urls_resolve_to_gcsfs():
    import fsspec
    import gcsfs

    for scheme in ("gs", "gcs"):
        filesystem = fsspec.get_filesystem_class(scheme)
        assert issubclass(filesystem, gcsfs.GCSFileSystem), scheme
    assert gcsfs.GCSFileSystem._strip_protocol("gs://bucket/run/checkpoints") == "bucket/run/checkpoints"


TINY_TEXT_ENCODERS = """
from titanpod.models.flux.text_encoders import FluxTextEncoders
text_BTD, pooled_BD = FluxTextEncoders.random().encode(["a red square"])
print("SHAPES", text_BTD.shape[0], pooled_BD.shape[0])
"""
"""The diffusion debug recipe's text encoders: tiny T5 and CLIP from transformers, initialised at random."""


def test_the_diffusion_text_encoders_build_without_a_download():
    # A fresh interpreter: once the session's tpu device is registered, seeding torch asks a chip-less
    # host's PJRT client for it.
    done = subprocess.run(
        [sys.executable, "-c", TINY_TEXT_ENCODERS],
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SHAPES 1 1" in done.stdout
