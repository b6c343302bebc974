"""The vLLM check's learning test run seed by seed: how much GRPO's reward rises with each engine.

``uv run python learns_by_seed.py [--seeds 1 2 3] [--modes local vllm] [--lr 0.005]`` (from envs/vllm) runs the
configuration of ``tests/test_grpo_learns.py`` (12 steps from a tiny random Llama, a lowercase-share reward) for
each engine and seed (``--lr 0``: with nothing learnt), and prints the mean reward of the first and last 3 steps,
their difference (the gain the test bounds) and the process's wall time. The test's bounds were set from these
figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    """Parse the seeds and engines, run each pair once, print a line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--modes", nargs="+", default=["local", "vllm"], choices=["local", "vllm"])
    parser.add_argument("--lr", type=float, default=5e-3, help="0 measures the gain with nothing learnt")
    options = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent / "tests"))
    from test_grpo_learns import WINDOW, gain, grpo, start

    with tempfile.TemporaryDirectory(prefix="titanpod-learns-") as folder:
        where = Path(folder)
        start(where)
        print(f"{'engine':7} {'seed':>4} {'first':>6} {'last':>6} {'gain':>6} {'wall s':>7}", flush=True)
        for mode in options.modes:
            for seed in options.seeds:
                started = time.perf_counter()
                steps = grpo(where, mode, seed, options.lr)
                wall = time.perf_counter() - started
                rewards = [row["reward_mean"] for row in steps]
                first, last = statistics.mean(rewards[:WINDOW]), statistics.mean(rewards[-WINDOW:])
                print(f"{mode:7} {seed:>4} {first:>6.3f} {last:>6.3f} {gain(steps):>6.3f} {wall:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
