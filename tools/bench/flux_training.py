"""FLUX training throughput: titanpod's step against a plain diffusers training loop, same tiny config, same run.

    uv run python tools/bench/flux_training.py [--steps 20] [--batch 32] [--resolution 16]

Both train the debug FLUX shape (the flux_debug recipe's transformer: width 64, one double-
and one single-stream block, 12 input channels of 2x2 pixel patches) by flow matching on the
same pre-made batches (latents, noise, timesteps, text states), with AdamW and gradient
clipping at 1.0, fp32 on the CPU:

- titanpod: ``FlowMatchingModel`` (titanpod's FLUX transformer) through the graph trainer's
  eager step (functional AdamW, clipping, NaN guard);
- diffusers: ``FluxTransformer2DModel`` with ``torch.optim.AdamW`` and ``clip_grad_norm_``,
  the loop a diffusers user writes.

Each runs one warm-up step, then ``--steps`` timed steps, the two loops' steps interleaved so
both see the same machine load; samples/s and the ratio to diffusers are printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch


def make_batches(args, steps: int, batch: int, side: int, text_tokens: int) -> list[dict[str, torch.Tensor]]:
    from titanpod.models.flux.flow_matching import image_position_ids, sample_timesteps, text_position_ids

    generator = torch.Generator().manual_seed(0)
    tokens = (side // 2) ** 2
    batches = []
    for _ in range(steps + 1):
        batches.append(
            {
                "latents": torch.randn(batch, tokens, args.in_channels, generator=generator),
                "noise": torch.randn(batch, tokens, args.in_channels, generator=generator),
                "timesteps": sample_timesteps(batch, tokens, generator),
                "text": torch.randn(batch, text_tokens, args.context_dim, generator=generator),
                "pooled": torch.randn(batch, args.pooled_dim, generator=generator),
                "img_ids": image_position_ids(side, side),
                "txt_ids": text_position_ids(text_tokens),
                "guidance": torch.ones(batch),
            }
        )
    return batches


def titanpod_step(args):
    from titanpod.device import get_backend
    from titanpod.graph import TrainConfig, build_step
    from titanpod.models.flux import build_flux_transformer
    from titanpod.models.flux.flow_matching import FlowMatchingModel

    transformer = build_flux_transformer(args, device="cpu")
    transformer.init_weights(0)
    step = build_step(FlowMatchingModel(transformer), TrainConfig(weight_decay=0.0), get_backend("cpu"))
    return lambda batch: float(step([batch], 1e-3).loss)


def diffusers_step(args):
    from diffusers import FluxTransformer2DModel

    from titanpod.models.flux.flow_matching import flow_matching_loss, noisy_latents

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        in_channels=args.in_channels,
        num_layers=args.depth,
        num_single_layers=args.depth_single,
        attention_head_dim=args.head_dim,
        num_attention_heads=args.n_heads,
        joint_attention_dim=args.context_dim,
        pooled_projection_dim=args.pooled_dim,
        guidance_embeds=args.guidance_embed,
        axes_dims_rope=tuple(args.axes_dims),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    def one_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x_t = noisy_latents(batch["latents"], batch["noise"], batch["timesteps"])
        velocity = model(
            hidden_states=x_t,
            encoder_hidden_states=batch["text"],
            pooled_projections=batch["pooled"],
            timestep=batch["timesteps"],
            img_ids=batch["img_ids"],
            txt_ids=batch["txt_ids"],
            guidance=batch["guidance"],
        ).sample
        loss = flow_matching_loss(velocity, batch["latents"], batch["noise"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return float(loss.detach())

    return one_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--resolution", type=int, default=16)
    parser.add_argument("--text-tokens", type=int, default=32)
    options = parser.parse_args()

    from titanpod.models.flux import FLUX_FLAVORS

    args = dataclasses.replace(FLUX_FLAVORS["debug"], in_channels=12)
    batches = make_batches(args, options.steps, options.batch, options.resolution, options.text_tokens)
    samples = options.steps * options.batch
    steps = {"diffusers loop": diffusers_step(args), "titanpod eager step": titanpod_step(args)}
    results = dict.fromkeys(steps, 0.0)
    for run in steps.values():
        run(batches[0])  # warm-up
    for batch in batches[1:]:  # interleaved, so both see the same machine load
        for name, run in steps.items():
            start = time.perf_counter()
            run(batch)
            results[name] += time.perf_counter() - start
    baseline = samples / results["diffusers loop"]
    threads = torch.get_num_threads()
    print(f"FLUX debug, {options.batch} x {options.resolution}px, {options.steps} timed steps, {threads} threads")
    for name, seconds in results.items():
        rate, per_step = samples / seconds, seconds / options.steps * 1000
        print(f"{name:22s} {rate:8.1f} samples/s   {per_step:7.1f} ms/step   {rate / baseline:5.2f}x")


if __name__ == "__main__":
    main()
