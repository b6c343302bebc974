"""``titanpod-posttrain``: post-train a language model from a recipe (supervised fine-tuning, GRPO).

titanpod-posttrain                                   # sft_debug: the llama3 debug model learns to reverse strings
titanpod-posttrain --list-recipes
titanpod-posttrain --recipe sft_debug --train.steps 50 --eval.examples 100
titanpod-posttrain --model.init-from runs/sft_debug-.../model   # start from a finished run's weights
titanpod-posttrain --data.source jsonl --data.path chats.jsonl --eval.task reverse
titanpod-posttrain --resume try1                     # continue the run try1 from its newest checkpoint
titanpod-posttrain --recipe sft_arith --output.run-name sft_arith                   # SFT on the word problems
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft_arith/model       # GRPO from that SFT model
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft_arith/model --rollout.mode ray --rollout.workers 2
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft/model --grpo.data-path mine.jsonl
    --grpo.reward-function my_rewards:score        # your prompts and answers (one command), your reward
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft_arith/model --dry-run --devices 2
                                                   # memory per device: trainer and rollout engine
titanpod-posttrain --recipe mine.toml --print-recipe  # a TOML file (base = "sft_debug" plus what differs), resolved
titanpod-posttrain --help                            # every flag, and every field of the recipe"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from titanpod.recipes.app import App, run_app

APP = App(prog="titanpod-posttrain", distribution="titanpod-posttrain", commands="titanpod.posttrain.command")
"""The command: its parsing, actions and training live in ``titanpod.posttrain.command``."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``titanpod-posttrain``; returns the process exit code."""
    return run_app(APP, argv)


if __name__ == "__main__":  # torchrun starts the command as this module
    sys.exit(main())
