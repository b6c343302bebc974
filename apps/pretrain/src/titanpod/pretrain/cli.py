"""``titanpod-pretrain``: pick a recipe, override any field, train, and report.

titanpod-pretrain                                  # llama3_debug on this machine
titanpod-pretrain --list-recipes
titanpod-pretrain --recipe llama3_debug --train.steps 20 --device.lane cpu
titanpod-pretrain --resume try1                     # continue the run try1 from its newest checkpoint
titanpod-pretrain --resume                         # continue the newest run of the recipe that has one
titanpod-pretrain --recipe llama3_405b --dry-run   # memory per device and step time on its target slice
titanpod-pretrain --recipe llama3_405b --dry-run --chip v5p --chips 512
titanpod-pretrain --recipe llama3_8b --compile-for target  # the step compiled by libtpu for its slice (envs/tpu)
titanpod-pretrain --recipe llama3_405b --rehearse  # run it here, small, with every setting, and check resume
titanpod-pretrain --recipe runs/try1/recipe.json   # a recipe file (any run's recipe.json)
titanpod-pretrain --recipe mine.toml --train.lr 1e-3  # a TOML file: base = "llama3_debug" plus what differs
titanpod-pretrain --recipe mine.toml --print-recipe  # the resolved recipe as JSON, without running
titanpod-pretrain --help                           # every flag, and every field of the recipe
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from titanpod.recipes.app import App, run_app

APP = App(prog="titanpod-pretrain", distribution="titanpod-pretrain", commands="titanpod.pretrain.command")
"""The command: its parsing, actions and training live in ``titanpod.pretrain.command``."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``titanpod-pretrain``; returns the process exit code."""
    return run_app(APP, argv)


if __name__ == "__main__":  # torchrun starts the command as this module
    sys.exit(main())
