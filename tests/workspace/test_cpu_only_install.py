"""The CPU-only installs of docs/installing.md: no nvidia-*, cuda-* or triton distribution, and titanpod trains.

PyPI has only the CUDA build of torch for Linux; the CPU build comes from PyTorch's own index, which these
tests do not reach. They take the same wheel, ``torch-VERSION+cpu-*.whl``, from a folder on disk: the one
named by ``TITANPOD_TORCH_CPU_WHEELS``, else one of pip's ``PIP_FIND_LINKS`` folders that holds it; without
one they are skipped. The rest comes from PyPI through uv's cache, as ``uv sync`` has it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.workspace.test_install_docs import documented_pip_lines

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
CUDA_STACK = re.compile(r"^(nvidia-|cuda-|triton)", re.IGNORECASE)

PROBE = """
import importlib.metadata, json, torch
names = sorted({d.metadata["Name"] for d in importlib.metadata.distributions()})
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "names": names}))
"""
"""What an environment holds: torch's version, its CUDA version (None for the CPU build), every distribution."""


def locked_torch_version() -> str:
    """The torch release in uv.lock."""
    lock = tomllib.loads((REPO_ROOT / "uv.lock").read_text())
    (version,) = {package["version"] for package in lock["package"] if package["name"] == "torch"}
    return version


@pytest.fixture(scope="module")
def uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "uv is needed to build a fresh environment (run the suite with `uv run pytest`)"
    return found


@pytest.fixture(scope="module")
def cpu_wheel() -> Path:
    """The CPU build of the locked torch for this machine's Python 3.11, from a folder on disk (else skip)."""
    version = locked_torch_version()
    folders = [os.environ.get("TITANPOD_TORCH_CPU_WHEELS", ""), *os.environ.get("PIP_FIND_LINKS", "").split()]
    for folder in filter(None, folders):
        wheels = sorted(Path(folder.removeprefix("file://")).glob(f"torch-{version}+cpu-cp311-cp311-*.whl"))
        if wheels:
            return wheels[0]
    pytest.skip(
        f"no torch-{version}+cpu-cp311 wheel on disk: set TITANPOD_TORCH_CPU_WHEELS to a folder holding the CPU build "
        "(from PyTorch's CPU index; PyPI has only the CUDA build)"
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the test session's own virtual environment."""
    env = {key: value for key, value in os.environ.items() if key not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"}}
    env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    return {**env, **extra}


def run(command: list[str], timeout: float = 600, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``command``; it must succeed (its output is shown when it does not)."""
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, env=clean_env(), **kwargs
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def probe(python: Path) -> dict:
    """The probe's answer from ``python``."""
    return json.loads(run([str(python), "-c", PROBE]).stdout.strip().splitlines()[-1])


def assert_cpu_only(python: Path, version: str) -> list[str]:
    """The environment of ``python`` holds the CPU build of ``version`` and no CUDA package; its distributions."""
    found = probe(python)
    assert found["torch"] == f"{version}+cpu" and found["cuda"] is None, found
    cuda = [name for name in found["names"] if CUDA_STACK.match(name)]
    assert cuda == [], f"CUDA packages installed: {cuda}"
    return found["names"]


def pretrain(bin_dir: Path, runs: Path, *flags: str) -> Path:
    """Train the default recipe a few steps with the environment's ``titanpod-pretrain``; its run directory."""
    name = "run-" + "-".join(flag.strip("-").replace(".", "_") for flag in flags) if flags else "run"
    run([str(bin_dir / "titanpod-pretrain"), "--train.steps", "2", "--output.runs-dir", str(runs),
         "--output.run-name", name, "--output.no-tensorboard", *flags], cwd=runs.parent)  # fmt: skip
    run_dir = runs / name
    assert (run_dir / "model" / "model.safetensors").is_file()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 1
    return run_dir


def test_the_cpu_only_install_from_the_lock_holds_no_cuda_package_and_trains(uv, cpu_wheel, tmp_path):
    venv = tmp_path / "venv"
    run([uv, "venv", "--quiet", "--python", "3.11", str(venv)], timeout=120)
    script = run(["bash", str(REPO_ROOT / "tools/install_cpu_only.sh"), "--venv", str(venv),
                  "--torch-from", str(cpu_wheel.parent), "--no-dev"], cwd=tmp_path)  # fmt: skip
    assert "no nvidia-*, cuda-* or triton package installed" in script.stdout
    names = assert_cpu_only(venv / "bin" / "python", locked_torch_version())
    # Every layer and app came from the lock, and the dev tools stayed out.
    assert {"titanpod-pretrain", "titanpod-posttrain", "titanpod-diffusion", "titanpod-rl", "jax"} <= set(names)
    assert "pytest" not in names
    runs = tmp_path / "runs"
    pretrain(venv / "bin", runs)
    # inductor compiles the whole step to C++ on the CPU without triton.
    whole = pretrain(venv / "bin", runs, "--train.step-mode", "whole_step")
    assert json.loads((whole / "recipe.json").read_text())["train"]["step_mode"] == "whole_step"


def test_pretrain_alone_installs_with_uv_pip_and_with_pip_beside_the_cpu_build(uv, cpu_wheel, tmp_path):
    version = locked_torch_version()
    for tool in ("uv pip", "pip"):
        venv = tmp_path / tool.replace(" ", "-")
        run([uv, "venv", "--quiet", "--seed", "--python", "3.11", str(venv)], timeout=120)
        python = venv / "bin" / "python"
        # Stands in for `--index-url https://download.pytorch.org/whl/cpu`: the same wheel, from the folder.
        torch_cpu = ["--find-links", str(cpu_wheel.parent), f"torch=={version}+cpu"]
        if tool == "uv pip":
            run([uv, "pip", "install", "--quiet", "--python", str(python), *torch_cpu], timeout=900)
            # The documented command: the sibling layers come from the workspace's sources.
            run([uv, "pip", "install", "--quiet", "--python", str(python), "./apps/pretrain"], cwd=REPO_ROOT)
        else:
            run([str(python), "-m", "pip", "install", "--quiet", *torch_cpu], timeout=900)
            # The documented command: docs/installing.md's line for titanpod-pretrain.
            folders = documented_pip_lines()["titanpod-pretrain"]
            run([str(python), "-m", "pip", "install", "--quiet", *folders], cwd=REPO_ROOT, timeout=900)
        names = assert_cpu_only(python, version)
        assert {"titanpod-pretrain", "titanpod-runs", "titanpod-data"} <= set(names), tool
        assert "titanpod-rl" not in names and "titanpod-posttrain" not in names, tool
    # The built wheels carry what a run reads from the package (the built-in corpus and tokenizer).
    pretrain(tmp_path / "pip" / "bin", tmp_path / "runs")
