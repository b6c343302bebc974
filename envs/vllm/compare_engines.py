"""GRPO with the built-in engine against GRPO with vLLM: the same tiny run, seed by seed, and what each step cost.

``uv run python compare_engines.py [--steps N] [--seeds 1 2 3]`` (from envs/vllm) saves a tiny random Llama as an
SFT run leaves its model, then runs ``titanpod-posttrain --recipe grpo_debug`` from it with ``--rollout.mode local``
and ``--rollout.mode vllm`` (fp32, eager, 16 MiB of KV cache) for each seed, on a reward a random model's
completions earn unevenly (distinct characters of a 4-token completion, over 4), and prints per run: the mean
reward of the first and last five steps, the median step time after the first step, the sync time and bytes,
and the whole process's wall time (vLLM's engine start included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REWARD = """
def distinct_characters(prompt, completion, row):
    return len(set(completion)) / 4
"""


def make_start(where: Path) -> None:
    """The tiny model folder and the reward module in ``where``."""
    sys.path.insert(0, str(Path(__file__).parent / "tests"))
    from conftest import TINY

    from titanpod.checkpoint import save_model
    from titanpod.data.sft.tokenizer import load_sft_tokenizer
    from titanpod.recipes.families import build_model

    model = build_model("llama3", TINY)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    save_model(model, "llama3", where / "model", {"step": 0}, extra_files=load_sft_tokenizer("chars").files())
    (where / "uneven.py").write_text(REWARD, encoding="utf-8")


def run(where: Path, mode: str, seed: int, steps: int) -> dict[str, float]:
    """One GRPO run; its figures."""
    name = f"{mode}-{seed}"
    command = [
        sys.executable, "-m", "titanpod.posttrain.cli", "--recipe", "grpo_debug", "--model.init-from", "model",
        "--train.steps", str(steps), "--train.warmup-steps", "1", "--train.seed", str(seed),
        "--grpo.prompts-per-step", "4", "--grpo.group-size", "6", "--grpo.max-new-tokens", "4",
        "--grpo.reward-function", "uneven:distinct_characters", "--grpo.eval-samples", "0",
        "--eval.examples", "4", "--eval.max-new-tokens", "4", "--device.lane", "cpu",
        "--checkpoint.export-hf", "False", "--output.run-name", name, "--rollout.mode", mode,
    ]  # fmt: skip
    if mode == "vllm":
        command += ["--rollout.vllm-dtype", "float32", "--rollout.vllm-enforce-eager", "True"]
        command += ["--rollout.vllm-kv-cache-mib", "16"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=where, capture_output=True, text=True, env={**os.environ}, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (where / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "reward_mean" in row]
    return {
        "first5": statistics.mean(row["reward_mean"] for row in rows[:5]),
        "last5": statistics.mean(row["reward_mean"] for row in rows[-5:]),
        "step_s": statistics.median(row["step_seconds"] for row in rows[1:]),
        "sync_ms": 1000 * statistics.median(row["sync_seconds"] for row in rows),
        "sync_bytes": rows[0]["sync_bytes"],
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="titanpod-compare-") as folder:
        where = Path(folder)
        make_start(where)
        print(f"{'engine':7} {'seed':>4} {'reward 1-5':>10} {'reward last 5':>13} {'step s':>7} {'sync ms':>8} "
              f"{'sync bytes':>10} {'wall s':>7}", flush=True)  # fmt: skip
        for mode in ("local", "vllm"):
            for seed in options.seeds:
                f = run(where, mode, seed, options.steps)
                print(f"{mode:7} {seed:>4} {f['first5']:>10.3f} {f['last5']:>13.3f} {f['step_s']:>7.3f} "
                      f"{f['sync_ms']:>8.1f} {f['sync_bytes']:>10} {f['wall_s']:>7.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
