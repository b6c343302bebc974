"""Training throughput and CPU MFU of each step mode, against eager measured in the same run.

    uv run python tools/bench/step_modes.py [--models debug,100m] [--steps 4] [--modes eager,per_block,whole_step]

For each model, each mode trains in a fresh process on the same random batches: one
warm-up step (which includes compilation), then ``--steps`` timed steps. Printed per run:
tokens/s over the timed steps, model TFLOP/s, MFU against this CPU's measured fp32 matmul
peak (``titanpod.device`` probe, measured in each process), the first step's time
(compilation included), and the ratio of tokens/s to eager's.

Models: ``debug`` is the Llama 3 debug flavor (batch 8 x 256 tokens); ``100m`` is a
Llama 3 shape of about 100M parameters (dim 768, 12 layers, 12 heads, 4 kv heads, ffn
2048, vocabulary 16,384; batch 2 x 512 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODELS = {
    "debug": {"flavor": "debug", "batch": 8, "seq": 256},
    "100m": {
        "args": {
            "dim": 768,
            "n_layers": 12,
            "n_heads": 12,
            "n_kv_heads": 4,
            "vocab_size": 16384,
            "ffn_dim": 2048,
            "max_seq_len": 512,
        },
        "batch": 2,
        "seq": 512,
    },
}


def _one(model_name: str, mode: str, steps: int) -> dict:
    import torch

    from titanpod.device import get_backend
    from titanpod.graph import TrainConfig, train
    from titanpod.models import DecoderArgs, Transformer, parameter_count
    from titanpod.recipes.families import build_model

    spec = MODELS[model_name]
    if "flavor" in spec:
        model = build_model("llama3", spec["flavor"], device="cpu")
    else:
        model = Transformer(DecoderArgs(**spec["args"]))
    model.init_weights(0)
    backend = get_backend("cpu")
    peak = backend.chip().peak_flops  # measured before training, outside the clock
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            tokens = torch.randint(0, model.args.vocab_size, (spec["batch"], spec["seq"] + 1), generator=generator)
            yield tokens[:, :-1], tokens[:, 1:]

    config = TrainConfig(steps=steps + 1, warmup_steps=1, log_every=1, step_mode=mode)
    first_step = []
    start = time.perf_counter()
    summary = train(
        model,
        batches(),
        config,
        backend,
        flops_per_token=model.flops_per_token(spec["seq"]),
        on_report=lambda r: first_step.append(time.perf_counter() - start) if r.step == 1 else None,
    )
    return {
        "model": model_name,
        "mode": mode,
        "parameters": parameter_count(model),
        "tokens_per_second": summary.tokens_per_second,
        "tflops": model.flops_per_token(spec["seq"]) * summary.tokens_per_second / 1e12,
        "mfu": summary.mfu,
        "peak_gflops": peak / 1e9,
        "first_step_seconds": first_step[0],
        "final_loss": summary.losses[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="debug,100m")
    parser.add_argument("--modes", default="eager,per_block,whole_step")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one[0], args.one[1], args.steps)))
        return
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    print(f"{'model':7s} {'params':>8s} {'mode':11s} {'tok/s':>9s} {'TFLOP/s':>8s} {'MFU':>6s} "
          f"{'1st step':>9s} {'vs eager':>8s}")  # fmt: skip
    for model_name in args.models.split(","):
        eager_tps = None
        for mode in args.modes.split(","):
            run = subprocess.run(
                [sys.executable, __file__, "--one", model_name, mode, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if run.returncode != 0:
                print(f"{model_name} {mode}: failed\n{run.stderr[-2000:]}")
                continue
            row = json.loads(run.stdout.strip().splitlines()[-1])
            if mode == "eager":
                eager_tps = row["tokens_per_second"]
            ratio = f"{row['tokens_per_second'] / eager_tps:.2f}x" if eager_tps else "-"
            print(
                f"{model_name:7s} {row['parameters'] / 1e6:7.1f}M {mode:11s} {row['tokens_per_second']:9,.0f} "
                f"{row['tflops']:8.3f} {row['mfu']:6.1%} {row['first_step_seconds']:8.1f}s {ratio:>8s}",
                flush=True,
            )
    print("MFU is against the CPU peak each process measured (fp32 matmul probe).")


if __name__ == "__main__":
    main()
