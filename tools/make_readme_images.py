"""Draw the docs' pictures with the real command lines: a loss curve and a diffusion sample grid.

    uv run python tools/make_readme_images.py             # both; flux_debug's 10,000 steps dominate (minutes)
    uv run python tools/make_readme_images.py --only loss

``loss``: ``titanpod-pretrain --recipe llama3_debug`` (its 100 steps, with a validation loss every 10 steps on 5% of
the built-in corpus held out); the run's ``loss.png`` becomes ``docs/images/loss.png``.
``samples``: ``titanpod-diffusion --recipe flux_debug`` (its 10,000 steps on the built-in shapes); the grid it draws
at the end (``samples/step-NNNNNN.png``, at its last step) becomes ``docs/images/samples.png`` (the run prints how
many of its prompts the grid follows). The runs go to a temporary folder; nothing else is kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
"""Where the docs' pictures live (README.md shows the loss curve; docs/ both)."""

RUNS = {
    "loss": (
        "titanpod.pretrain.cli",
        ["--recipe", "llama3_debug", "--data.validation-fraction", "0.05", "--data.validation-every", "10"],
        "loss.png",
    ),
    "samples": ("titanpod.diffusion.cli", ["--recipe", "flux_debug"], "samples/step-*.png"),
}
"""Picture name -> (the app's module, its arguments, the file of the run directory that becomes the picture: a glob
pattern names the last file it matches)."""


def make(name: str, runs_dir: Path) -> Path:
    """Run the command behind picture ``name`` and copy its picture into ``docs/images/<name>.png``."""
    module, args, picture = RUNS[name]
    output = ["--output.runs-dir", str(runs_dir), "--output.run-name", name, "--output.no-save-weights"]
    command = [sys.executable, "-m", module, *args, *output, "--checkpoint.no-at-end", "--output.no-tensorboard"]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    IMAGES.mkdir(parents=True, exist_ok=True)
    target = IMAGES / f"{name}.png"
    shutil.copyfile(sorted((runs_dir / name).glob(picture))[-1], target)
    print(f"wrote {target} ({target.stat().st_size / 1024:.0f} KiB)", flush=True)
    return target


def main() -> None:
    """Draw the pictures asked for (default: all)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(RUNS), action="append", help="draw only this picture (repeatable)")
    chosen = parser.parse_args().only or sorted(RUNS)
    with tempfile.TemporaryDirectory() as runs_dir:
        for name in chosen:
            make(name, Path(runs_dir))


if __name__ == "__main__":
    main()
