"""Run a few GRPO steps of a tiny model, in one process or sharded under torchrun, and write (rank 0) each
step's loss and rollout figures as JSON.

    python tests/rl/grpo_worker.py --init-from <sft model folder> --runs-dir runs --out one.json
    torchrun --nproc-per-node 2 tests/rl/grpo_worker.py --init-from <folder> --runs-dir runs --fsdp 2 --out two.json
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
from pathlib import Path

from titanpod.checkpoint import CheckpointConfig
from titanpod.device import DeviceConfig, process_info
from titanpod.parallel import ParallelConfig
from titanpod.recipes.posttrain.grpo_recipe import GRPOConfig, GRPOModelConfig
from titanpod.recipes.posttrain.registry import grpo_debug
from titanpod.recipes.posttrain.sft_recipe import EvalConfig
from titanpod.recipes.recipe import OutputConfig
from titanpod.rl.grpo.run import run_grpo
from titanpod.runs.process_exit import exit_rank


def lowercase_share(prompt: str, completion: str, answer: str) -> float:
    """A dense reward: the share of lowercase letters in the completion."""
    return sum(char.islower() for char in completion) / max(len(completion), 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-from", required=True)
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--run-name", required=True)
    parser.add_argument("--fsdp", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-mode", default="eager")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    base = grpo_debug()
    recipe = dataclasses.replace(
        base,
        model=GRPOModelConfig(init_from=args.init_from),
        device=DeviceConfig(lane="cpu"),
        parallel=ParallelConfig(fsdp=args.fsdp),
        grpo=GRPOConfig(group_size=3, prompts_per_step=4, max_new_tokens=4, kl_beta=0.1, updates_per_step=2),
        train=dataclasses.replace(
            base.train, steps=args.steps, lr=1e-2, warmup_steps=1, step_mode=args.step_mode, compiler="none"
        ),
        eval=EvalConfig(examples=4, max_new_tokens=4, show=0),
        checkpoint=CheckpointConfig(export_hf=False),
        output=OutputConfig(runs_dir=args.runs_dir, run_name=args.run_name, tensorboard=False),
    )
    result = run_grpo(recipe, reward=lowercase_share)
    if process_info().is_main:
        rows = [
            {"loss": row.loss, "reward_mean": row.reward_mean, "samples": row.samples, "clip": row.clip_fraction,
             "kl": row.kl, "completion_length": row.completion_length, "version": row.weights_version}
            for row in result.history
        ]  # fmt: skip
        args.out.write_text(json.dumps({"steps": rows, "weights": str(result.weights_path)}), encoding="utf-8")


if __name__ == "__main__":
    faulthandler.enable()  # an abort during the work prints every thread's stack
    main()
    exit_rank(0)  # as the CLIs' ranks leave: see titanpod.runs.process_exit.exit_rank
