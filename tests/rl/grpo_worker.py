"""Run a few GRPO steps of a tiny model, in one process or sharded under torchrun, and write (rank 0) each
step's loss and rollout figures as JSON. With ``--meter`` every rank also writes what it read of the SFT folder
(bytes, per model placed) and the most bytes of gathered weights alive at once during its syncs.

    python tests/rl/grpo_worker.py --init-from <sft model folder> --runs-dir runs --out one.json
    torchrun --nproc-per-node 2 tests/rl/grpo_worker.py --init-from <folder> --runs-dir runs --fsdp 2 --out two.json
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import weakref
from pathlib import Path

from titanpod.checkpoint import CheckpointConfig
from titanpod.checkpoint.pretrained import PretrainedFolder
from titanpod.device import DeviceConfig, process_info
from titanpod.parallel import ParallelConfig
from titanpod.recipes.posttrain.grpo_recipe import GRPOConfig, GRPOModelConfig
from titanpod.recipes.posttrain.registry import grpo_debug
from titanpod.recipes.posttrain.sft_recipe import EvalConfig
from titanpod.recipes.recipe import OutputConfig
from titanpod.rl.grpo.run import run_grpo
from titanpod.rl.rollout import streamed
from titanpod.runs.process_exit import exit_rank


def lowercase_share(prompt: str, completion: str, answer: str) -> float:
    """A dense reward: the share of lowercase letters in the completion."""
    return sum(char.islower() for char in completion) / max(len(completion), 1)


class Meter:
    """What this rank reads of the folder and holds during its weight syncs."""

    def __init__(self) -> None:
        self.readers: list = []
        self.sync_peak_bytes = 0
        reader, gather = PretrainedFolder.reader, streamed.gathered_weights

        def counted_reader(folder, model, *args, **kwargs):
            made = reader(folder, model, *args, **kwargs)
            self.readers.append(made)
            return made

        def metered_gather(model, dtype):
            alive: list[weakref.ref] = []
            for name, tensor in gather(model, dtype):
                alive.append(weakref.ref(tensor))
                held = sum(t.numel() * t.element_size() for t in (ref() for ref in alive) if t is not None)
                self.sync_peak_bytes = max(self.sync_peak_bytes, held)
                yield name, tensor
                del tensor

        PretrainedFolder.reader = counted_reader  # type: ignore[method-assign]
        streamed.gathered_weights = metered_gather  # type: ignore[assignment]

    def record(self) -> dict:
        return {"bytes_read": [r.bytes_read for r in self.readers], "sync_peak_bytes": self.sync_peak_bytes}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-from", required=True)
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--run-name", required=True)
    parser.add_argument("--fsdp", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-mode", default="eager")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--meter", action="store_true")
    args = parser.parse_args()
    meter = Meter() if args.meter else None
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
    if meter is not None:
        rank_out = args.out.with_name(f"{args.out.stem}.rank{process_info().rank}.json")
        rank_out.write_text(json.dumps(meter.record()), encoding="utf-8")
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
