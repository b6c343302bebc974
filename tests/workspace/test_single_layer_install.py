"""A user can install one layer alone: titanpod-models without the layers above it."""

import os
import shutil
import subprocess

import pytest


@pytest.mark.slow
def test_models_layer_installs_and_imports_without_the_layers_above(repo_root, tmp_path):
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to build a fresh environment (run the suite with `uv run pytest`)"
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", "3.11", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(python), "--link-mode", "hardlink",
         str(repo_root / "packages/device"), str(repo_root / "packages/models")],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    probe = (
        "import importlib.util, torch\n"
        "from titanpod.models import Transformer, parameter_count\n"
        "from titanpod.models.llama3 import LLAMA3_FLAVORS\n"
        "print(parameter_count(Transformer(LLAMA3_FLAVORS['debug'])))\n"
        "print([n for n in ('titanpod.parallel', 'titanpod.graph', 'titanpod.recipes')"
        " if importlib.util.find_spec(n) is not None])\n"
    )
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    count, importable_above = result.stdout.split("\n")[:2]
    assert int(count) == 5_573_888
    assert importable_above == "[]"
    listed = subprocess.run([uv, "pip", "list", "--python", str(python)], capture_output=True, text=True, check=True)
    assert "titanpod-models" in listed.stdout and "titanpod-parallel" not in listed.stdout
