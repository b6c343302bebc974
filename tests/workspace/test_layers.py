"""The layer order of docs/architecture.md, enforced by import-linter."""

import shutil
import subprocess
import sys
from pathlib import Path

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(config: Path, cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(cwd)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_tree_keeps_the_layer_contract(repo_root):
    result = lint_imports(repo_root / "pyproject.toml", repo_root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_is_rejected(repo_root, tmp_path):
    src_dirs = []
    for package_src in sorted((repo_root / "packages").glob("*/src")) + sorted((repo_root / "apps").glob("*/src")):
        copy = tmp_path / package_src.parent.name / "src"
        shutil.copytree(package_src, copy, ignore=shutil.ignore_patterns("__pycache__", "*.txt", "*.json"))
        src_dirs.append(str(copy))
    offender = tmp_path / "device" / "src" / "titanpod" / "device" / "chips.py"
    offender.write_text(offender.read_text() + "\nfrom titanpod.models import parameter_count  # upward\n")
    result = lint_imports(repo_root / "pyproject.toml", tmp_path, pythonpath=":".join(src_dirs))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert "titanpod.device.chips -> titanpod.models" in result.stdout
