"""Images from prompts: Euler integration of the transformer's velocity, with classifier-free guidance.

Legend: B batch, L image tokens, P packed channels, T text tokens, D text width.
"""

from __future__ import annotations

import torch

from titanpod.models.flux.flow_matching import (
    euler_sample,
    image_position_ids,
    sampling_schedule,
    text_position_ids,
    unpack_latents,
)
from titanpod.recipes.diffusion.recipe import SampleConfig
from titanpod.runs.diffusion.components import DiffusionModels


@torch.no_grad()
def generate(
    models: DiffusionModels, prompts: list[str], resolution: int, config: SampleConfig, guidance: float = 1.0
) -> torch.Tensor:
    """One image per prompt, [B, 3, resolution, resolution] in [-1, 1], the same for the same ``config.seed``.

    Each Euler step that starts above ``config.cfg_stop`` is guided by ``config.cfg_scale``; the rest take the
    conditional velocity alone."""
    if not prompts:
        raise ValueError("Give at least one prompt.")
    transformer = models.transformer
    device = next(transformer.parameters()).device
    side = resolution // models.codec.downsample
    if side % 2 or side * models.codec.downsample != resolution:
        raise ValueError(
            f"Resolution {resolution} must be a multiple of {2 * models.codec.downsample} for this codec "
            "(its latents are packed in 2x2 patches)."
        )
    B, L, P = len(prompts), (side // 2) ** 2, models.codec.channels * 4
    text_BTD, pooled_BD = models.text_encoders.encode(list(prompts))
    empty_BTD, empty_pooled_BD = models.text_encoders.encode([""] * B)
    img_ids, txt_ids = image_position_ids(side, side, device), text_position_ids(text_BTD.shape[1], device)
    guidance_B = torch.full((B,), guidance, device=device) if transformer.args.guidance_embed else None
    generator = torch.Generator().manual_seed(config.seed)
    noise_BLP = torch.randn(B, L, P, generator=generator).to(device)

    def velocity(x_BLP: torch.Tensor, t_B: torch.Tensor) -> torch.Tensor:
        conditioned = transformer(x_BLP, img_ids, text_BTD.to(device), txt_ids, t_B, pooled_BD.to(device), guidance_B)
        if config.cfg_scale == 1.0 or float(t_B[0]) <= config.cfg_stop:  # every sample of a step shares its t
            return conditioned
        plain = transformer(x_BLP, img_ids, empty_BTD.to(device), txt_ids, t_B, empty_pooled_BD.to(device), guidance_B)
        return plain + config.cfg_scale * (conditioned - plain)

    was_training = transformer.training
    transformer.eval()
    try:
        x0_BLP = euler_sample(velocity, noise_BLP, sampling_schedule(config.steps, L))
    finally:
        transformer.train(was_training)
    return models.codec.decode(unpack_latents(x0_BLP, side, side)).float().cpu()
