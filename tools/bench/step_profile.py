"""Where a step's time goes, and the most any step running the same matmuls and attention could gain on it.

    uv run python tools/bench/step_profile.py [--model 100m|debug|anchors] [--variants eager,whole_step] [--steps 3]

Builds each variant (``tools/bench/step_modes_alternating.py``'s ``mode[:policy[:precision]][+attention]``) on
the shape, warms it up (compilation included), then runs ``--steps`` steps under ``torch.profiler`` and sorts
the CPU ops' own time into matmuls (``aten::mm``, ``addmm``, ``bmm``), attention (ATen's SDPA kernels and
``titanpod::cpu_attention``), the optimizer (``_fused_adamw_``, ``_foreach_*``) and the rest of the wall time
(elementwise ops, norms, the loss, copies, inductor's fused kernels, Python and dispatch).

Printed per variant: the share of each and the *ceiling*, step time over matmul + attention time: how much faster
than this variant a step could be that runs the same matmuls and attention and nothing else. A compiled step
calls the same ATen matmuls and attention kernels as the eager step, so eager's ceiling bounds what compiling the
step can give at that shape.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_modes import MODELS  # the shapes step_modes.py measures
from step_modes_alternating import ANCHORS, _build

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm")
ATTENTION = ("aten::_scaled_dot_product", "aten::_flash_attention", "titanpod::cpu_attention")
OPTIMIZER = ("aten::_fused_adamw", "aten::_foreach_", "titanpod::fused_adamw")


def category(name: str) -> str:
    """Which part of the step an op's own time counts towards."""
    if name in MATMUL:
        return "matmul"
    if name.startswith(ATTENTION):
        return "attention"
    if name.startswith(OPTIMIZER):
        return "optimizer"
    return "rest"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="100m", choices=["anchors", *MODELS])
    parser.add_argument("--variants", default="eager,whole_step")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import torch
    from torch.profiler import ProfilerActivity, profile

    spec = ANCHORS if args.model == "anchors" else MODELS[args.model]
    generator = torch.Generator().manual_seed(0)
    rows = []
    for variant in args.variants.split(","):
        model, step = _build(spec, variant)

        def one_step(model=model, step=step) -> None:
            tokens = torch.randint(0, model.args.vocab_size, (spec["batch"], spec["seq"] + 1), generator=generator)
            float(step([(tokens[:, :-1], tokens[:, 1:])], 8e-4).loss)

        for _ in range(3):
            one_step()
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            started = time.perf_counter()
            for _ in range(args.steps):
                one_step()
            wall_us = (time.perf_counter() - started) * 1e6
        events = profiled.key_averages()
        parts = {"matmul": 0.0, "attention": 0.0, "optimizer": 0.0}
        for event in events:
            part = category(event.key)
            if part in parts:
                parts[part] += event.self_cpu_time_total
        parts["rest"] = max(wall_us - sum(parts.values()), 0.0)
        rows.append((variant, wall_us / args.steps / 1e3, {k: v / wall_us for k, v in parts.items()}))
        print(f"{variant}: profiled", file=sys.stderr, flush=True)
    print(f"\n{args.model}, {spec['batch']} x {spec['seq']} tokens a step, {args.steps} profiled steps")
    print("| variant | step (ms) | matmul | attention | optimizer | rest | ceiling (step / (matmul + attention)) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for variant, step_ms, share in rows:
        ceiling = 1 / (share["matmul"] + share["attention"])
        print(
            f"| {variant} | {step_ms:,.0f} | {share['matmul']:.1%} | {share['attention']:.1%} "
            f"| {share['optimizer']:.1%} | {share['rest']:.1%} | {ceiling:.2f}x |"
        )


if __name__ == "__main__":
    main()
