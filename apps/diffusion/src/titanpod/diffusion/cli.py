"""``titanpod-diffusion``: train a FLUX.1 transformer by flow matching, plan it, or draw images from a run.

titanpod-diffusion                                   # flux_debug on the built-in shapes, on this machine
titanpod-diffusion --list-recipes
titanpod-diffusion --recipe flux1_12b --dry-run      # memory per device and step time on its target slice
titanpod-diffusion --recipe flux1_12b --compile-for target  # the step compiled by libtpu for its slice (envs/tpu)
titanpod-diffusion --recipe flux1_12b --rehearse     # run it here, small, with every setting, and check resume
titanpod-diffusion --train.steps 100 --data.batch-size 8
titanpod-diffusion --recipe mine.toml --print-recipe  # a TOML file (base = "flux_debug" plus what differs), resolved
titanpod-diffusion sample --checkpoint runs/flux_debug-... --prompt "a large red circle on the left"
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from titanpod.recipes.app import App, run_app

APP = App(
    prog="titanpod-diffusion",
    distribution="titanpod-diffusion",
    commands="titanpod.diffusion.command",
    resume_flag="--output.run-name",  # a run named as an earlier one continues from its newest checkpoint
)
"""The command: its parsing, actions and training live in ``titanpod.diffusion.command``."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``titanpod-diffusion``; returns the process exit code."""
    return run_app(APP, argv)


if __name__ == "__main__":  # torchrun starts the command as this module
    sys.exit(main())
