"""Step modes against eager in one process, their steps alternating: ratios that survive a drifting machine.

    uv run python tools/bench/step_modes_alternating.py [--model debug|100m|anchors] [--rounds 10]
        [--variants eager,whole_step:save,whole_step:selective]

``tools/bench/step_modes.py`` runs each mode in its own process, one after the other, so a
machine whose speed drifts from minute to minute (shared CPUs) moves one mode's figure and
not the other's. Here every variant is built in one process on the same model shape and
weights, warmed up (compilation included, from the compiled-step cache when it has the step),
then the variants take turns, one step each, for ``--rounds`` rounds: drift lands on all of
them alike. Printed per variant: the median and best step time, tokens/s and the ratio of
medians to the first variant's.

Variants are ``mode[:memory_policy[:precision]][+attention]`` (``+cpu_flash``: that
``kernels.attention``). Models: those of ``step_modes.py``, and
``anchors``, the shape of ``vs_anchors.py`` (torchtitan's llama3 debugmodel at batch 4 x 512).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_modes import MODELS  # the shapes step_modes.py measures

ANCHORS = {
    "args": {
        "dim": 256,
        "n_layers": 6,
        "n_heads": 16,
        "n_kv_heads": 16,
        "vocab_size": 2048,
        "ffn_dim": 768,
        "rope_theta": 500000.0,
        "max_seq_len": 512,
    },
    "llama31_scaling": True,
    "batch": 4,
    "seq": 512,
}


def _build(spec: dict, variant: str, step_compiler: str = "inductor"):
    """A fresh model of ``spec`` (seed 0) and its step for ``variant`` (``mode[:policy[:precision]][+attention]``),
    the whole step compiled by ``step_compiler``."""
    import torch

    from titanpod.device import get_backend
    from titanpod.graph import TrainConfig, build_step
    from titanpod.kernels import KernelConfig, model_ops
    from titanpod.models import DecoderArgs, Transformer
    from titanpod.models.common.rope import Llama3RopeScaling
    from titanpod.recipes.families import build_model

    variant, _, attention = variant.partition("+")
    ops = model_ops(KernelConfig(attention=attention or "sdpa"))
    torch.manual_seed(0)
    if "flavor" in spec:
        model = build_model("llama3", spec["flavor"], ops, device="cpu")
    else:
        scaling = {"rope_scaling": Llama3RopeScaling()} if spec.get("llama31_scaling") else {}
        model = Transformer(DecoderArgs(**spec["args"], **scaling), ops)
    model.init_weights(0)
    parts = variant.split(":")
    mode, policy, precision = parts + ["eager", "save", "fp32"][len(parts) :]
    config = TrainConfig(
        lr=8e-4, warmup_steps=0, decay="constant", weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,
        step_mode=mode, memory_policy=policy, precision=precision, step_compiler=step_compiler,
    )  # fmt: skip
    return model, build_step(model, config, get_backend("cpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="anchors", choices=["anchors", *MODELS])
    parser.add_argument("--variants", default="eager,whole_step")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="steps per variant after its first, untimed")
    args = parser.parse_args()
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import torch

    spec = ANCHORS if args.model == "anchors" else MODELS[args.model]
    variants = args.variants.split(",")
    generator = torch.Generator().manual_seed(0)
    batch, seq = spec["batch"], spec["seq"]

    def timed_step(model, step) -> float:
        tokens = torch.randint(0, model.args.vocab_size, (batch, seq + 1), generator=generator)
        started = time.perf_counter()
        float(step([(tokens[:, :-1], tokens[:, 1:])], 8e-4).loss)  # the loss read back, as every anchor does
        return time.perf_counter() - started

    built = []
    for variant in variants:
        model, step = _build(spec, variant)
        print(f"{variant}: first step {timed_step(model, step):.1f} s (compilation included)", flush=True)
        for _ in range(args.warmup):
            timed_step(model, step)
        built.append((model, step))
    times: list[list[float]] = [[] for _ in variants]
    for round_index in range(args.rounds):
        for index, (model, step) in enumerate(built):
            times[index].append(timed_step(model, step))
        print(f"round {round_index + 1}/{args.rounds}", file=sys.stderr, flush=True)
    baseline = statistics.median(times[0])
    print(f"\n{args.model}, {batch} x {seq} tokens a step, {args.rounds} alternating rounds")
    print(f"| variant | median step (s) | best step (s) | tok/s | vs {variants[0]} |")
    print("| --- | --- | --- | --- | --- |")
    for variant, samples in zip(variants, times, strict=True):
        median = statistics.median(samples)
        print(
            f"| {variant} | {median:.3f} | {min(samples):.3f} | {batch * seq / median:,.0f} | {baseline / median:.2f} |"
        )


if __name__ == "__main__":
    main()
