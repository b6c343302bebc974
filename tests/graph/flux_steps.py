"""A small FLUX objective, its batches and the figures its parity tests compare, shared by the in-process
tests and the xla lane's subprocess."""

from __future__ import annotations

import dataclasses

import torch

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, build_step, train
from titanpod.models.flux import FLUX_FLAVORS, FluxOps, build_flux_transformer
from titanpod.models.flux.flow_matching import (
    FlowMatchingModel,
    image_position_ids,
    sample_timesteps,
    text_position_ids,
)

STEPS = 10
MICRO_BATCHES = 2
BATCH = 8
LATENT_SIDE = 8
TEXT_TOKENS = 8


def flux_objective(ops: FluxOps | None = None) -> FlowMatchingModel:
    """The debug flavor with two double- and two single-stream blocks, every parameter moved off its init.

    FLUX starts its modulations at zero (each block the identity), which would leave most block weights
    without a gradient in the first steps; a seeded perturbation makes every block take part from step 1.
    """
    args = dataclasses.replace(FLUX_FLAVORS["debug"], depth=2, depth_single=2)
    transformer = build_flux_transformer(args, ops, device="cpu")
    transformer.init_weights(0)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in transformer.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return FlowMatchingModel(transformer)


def flux_batches(count: int = STEPS * MICRO_BATCHES) -> list[dict[str, torch.Tensor]]:
    """Flow-matching batches with their noise and logit-normal timesteps drawn from one seeded generator."""
    generator = torch.Generator().manual_seed(1)
    tokens = (LATENT_SIDE // 2) ** 2
    batches = []
    for _ in range(count):
        batches.append(
            {
                "latents": torch.randn(BATCH, tokens, 64, generator=generator),
                "noise": torch.randn(BATCH, tokens, 64, generator=generator),
                "timesteps": sample_timesteps(BATCH, tokens, generator),
                "text": torch.randn(BATCH, TEXT_TOKENS, 64, generator=generator),
                "pooled": torch.randn(BATCH, 32, generator=generator),
                "img_ids": image_position_ids(LATENT_SIDE, LATENT_SIDE),
                "txt_ids": text_position_ids(TEXT_TOKENS),
                "guidance": torch.full((BATCH,), 3.5),
            }
        )
    return batches


def train_flux(
    lane: str = "cpu", step_options: dict | None = None, ops: FluxOps | None = None, **config
) -> tuple[list[float], dict]:
    """Train ``flux_objective`` (its attention slot filled by ``ops``) for ``STEPS`` steps of ``MICRO_BATCHES``
    micro-batches on ``lane``; its losses and final parameters."""
    model = flux_objective(ops)
    train_config = TrainConfig(
        steps=STEPS, warmup_steps=1, log_every=STEPS, grad_accum_steps=MICRO_BATCHES, lr=1e-3, **config
    )
    backend = get_backend(lane)
    step = build_step(model, train_config, backend, **(step_options or {}))
    summary = train(model, iter(flux_batches()), train_config, backend, flops_per_token=1.0, step=step)
    return summary.losses, {name: param.detach().clone() for name, param in model.named_parameters()}


def differences(losses: list[float], params: dict, reference: tuple[list[float], dict]) -> dict[str, float]:
    """How far ``losses`` and ``params`` are from ``reference``: the largest relative loss difference, the
    largest per-tensor ``||p - p_ref|| / ||p_ref||``, and the same over all parameters as one vector."""
    ref_losses, ref_params = reference
    assert len(losses) == len(ref_losses) == STEPS
    loss = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    per_tensor = {name: ((params[name] - ref).norm() / ref.norm()).item() for name, ref in ref_params.items()}
    difference = torch.cat([(params[name] - ref).flatten() for name, ref in ref_params.items()])
    whole = torch.cat([ref.flatten() for ref in ref_params.values()])
    worst = max(per_tensor, key=per_tensor.__getitem__)
    return {
        "loss": loss,
        "tensor": per_tensor[worst],
        "worst_tensor": worst,
        "all": (difference.norm() / whole.norm()).item(),
    }
