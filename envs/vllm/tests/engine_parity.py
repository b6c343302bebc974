"""Starts titanpod's vLLM engine on tiny models and measures how its logprobs follow the trainer's weights: a Llama
with its own output head, and a Qwen 3 whose head is tied to its embedding (vLLM keeps packed copies of both).

Run as a script (vLLM's engine starts in its own process, so this needs a main guard):
``python engine_parity.py OUT.json [DTYPE]`` (the engine's dtype, ``float32`` unless given; the trainer stays in
fp32). It writes, for each family, the figures the test checks:
- ``start``: the largest |vLLM - titanpod| logprob of a fixed completion, vLLM started from the exported folder;
- ``stale``: the same after the trainer's weights moved, before the push (the engine still holds the old ones);
- ``pushed``: the same after the push (``sync_weights``, version 1);
- ``sampled``: vLLM's logprobs of its own sampled completions after the push against titanpod's recomputation;
- the engine's start time, and the push's bytes, dtype, seconds and weights version.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

FIXED = [5, 17, 42, 99, 3, 64, 8, 120, 33, 71, 2, 90]
"""A fixed sequence: a prompt of 4 tokens and a completion of 8."""


def largest_difference(engine_logprobs: torch.Tensor, ours: torch.Tensor) -> float:
    """The largest absolute difference between two logprob vectors of the same tokens."""
    assert engine_logprobs.shape == ours.shape, (engine_logprobs.shape, ours.shape)
    return (engine_logprobs - ours).abs().max().item()


def measure(family: str, args: Any, dtype: str) -> dict[str, object]:
    """The figures of one engine holding a ``family`` model of shape ``args`` in ``dtype``."""
    from titanpod.models import Transformer
    from titanpod.rl.grpo.objective import token_logprobs
    from titanpod.rl.rollout import SamplingParams, sync_weights
    from titanpod.rl.rollout.vllm_engine import VLLMEngine

    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    model.init_weights(0)

    def ours(sequence: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return token_logprobs(model, torch.tensor([sequence]))[0, 1:]

    started = time.perf_counter()
    engine = VLLMEngine(model, family, dtype=dtype, enforce_eager=True, max_batch=8, kv_cache_bytes=16 * 2**20)
    figures: dict[str, object] = {"engine_seconds": time.perf_counter() - started, "vllm_start": engine.start_seconds}
    try:
        figures["start"] = largest_difference(engine.score([FIXED])[0], ours(FIXED))
        with torch.no_grad():  # an optimizer step's worth of change, and more
            generator = torch.Generator().manual_seed(1)
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
        figures["stale"] = largest_difference(engine.score([FIXED])[0], ours(FIXED))
        report = sync_weights(model, engine, version=1)
        figures["pushed"] = largest_difference(engine.score([FIXED])[0], ours(FIXED))
        params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0, seed=7, n=3)
        completions = engine.generate([FIXED[:4], FIXED[4:9]], params)
        figures["sampled"] = max(
            largest_difference(c.logprobs, ours(c.prompt_ids + c.token_ids)[len(c.prompt_ids) - 1 :])
            for c in completions
        )
        figures["sampled_tokens"] = sum(len(c.token_ids) for c in completions)
        figures["push"] = {
            "version": engine.weights_version,
            "bytes": report.bytes,
            "dtype": report.extra["dtype"],
            "seconds": report.seconds,
            "checksum_equal": report.checksum == engine.checksum(),
        }
    finally:
        engine.close()
    return figures


def main(out: Path, dtype: str) -> None:
    from conftest import MODELS

    figures = {family: measure(family, args, dtype) for family, args in MODELS.items()}
    out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "float32")
