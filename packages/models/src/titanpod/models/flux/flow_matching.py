"""Rectified flow, as FLUX.1 trains and samples: latents packing, timesteps, the objective, an Euler sampler.

Legend: B batch, C latent channels, H and W latent height and width, L image tokens
((H/2) x (W/2)), P packed channels (C x 2 x 2).

A noisy latent lies on the straight line between data and noise, ``x_t = (1 - t) x_0 + t e``
with ``t`` in [0, 1]; the transformer predicts the velocity ``e - x_0`` along it. Timesteps are
drawn logit-normal and shifted towards noise for larger images (more tokens), by the rule
FLUX uses: ``shift(t) = e^mu / (e^mu + 1/t - 1)`` with ``mu`` linear in the token count.
"""

from __future__ import annotations

import math

import torch


def pack_latents(latents_BCHW: torch.Tensor) -> torch.Tensor:
    """Cut latents into 2x2 patches, one token each: [B, C, H, W] -> [B, L, C x 4] (diffusers' order)."""
    B, C, H, W = latents_BCHW.shape
    if H % 2 or W % 2:
        raise ValueError(f"Latent height and width must be even to pack 2x2 patches, got {H} x {W}.")
    patches = latents_BCHW.view(B, C, H // 2, 2, W // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(B, (H // 2) * (W // 2), C * 4)


def unpack_latents(tokens_BLP: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Undo ``pack_latents`` for latents of ``height`` x ``width``: [B, L, C x 4] -> [B, C, H, W]."""
    B, _, P = tokens_BLP.shape
    C = P // 4
    patches = tokens_BLP.view(B, height // 2, width // 2, C, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(B, C, height, width)


def image_position_ids(height: int, width: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Position ids of packed image tokens, [L, 3]: (0, row, column) of each 2x2 patch."""
    rows = torch.arange(height // 2, device=device).repeat_interleave(width // 2)
    cols = torch.arange(width // 2, device=device).repeat(height // 2)
    return torch.stack([torch.zeros_like(rows), rows, cols], dim=1).float()


def text_position_ids(text_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Position ids of text tokens, [T, 3]: all zero (text carries no 2-D position)."""
    return torch.zeros(text_tokens, 3, device=device)


def shift_mu(
    image_tokens: int, base_tokens: int = 256, max_tokens: int = 4096, base: float = 0.5, top: float = 1.15
) -> float:
    """The shift exponent for ``image_tokens``: ``base`` at ``base_tokens``, ``top`` at ``max_tokens``, linear."""
    slope = (top - base) / (max_tokens - base_tokens)
    return base + slope * (image_tokens - base_tokens)


def shift_timesteps(t: torch.Tensor, mu: float) -> torch.Tensor:
    """Move timesteps towards noise: ``e^mu / (e^mu + 1/t - 1)``; 0 and 1 stay where they are."""
    t = t.double()
    shifted = math.exp(mu) / (math.exp(mu) + (1.0 / t.clamp_min(1e-12) - 1.0))
    return torch.where(t > 0, shifted, torch.zeros_like(t)).float()


def sample_timesteps(batch: int, image_tokens: int, generator: torch.Generator, shift: bool = True) -> torch.Tensor:
    """Training timesteps, [B]: ``sigmoid`` of a standard normal (logit-normal), then shifted for the image size."""
    t_B = torch.sigmoid(torch.randn(batch, generator=generator))
    return shift_timesteps(t_B, shift_mu(image_tokens)) if shift else t_B


def noisy_latents(x0_BLP: torch.Tensor, noise_BLP: torch.Tensor, t_B: torch.Tensor) -> torch.Tensor:
    """The point ``(1 - t) x_0 + t e`` on the straight path from data to noise."""
    t = t_B.to(x0_BLP.dtype).view(-1, *([1] * (x0_BLP.ndim - 1)))
    return (1 - t) * x0_BLP + t * noise_BLP


def flow_matching_loss(velocity_BLP: torch.Tensor, x0_BLP: torch.Tensor, noise_BLP: torch.Tensor) -> torch.Tensor:
    """Mean squared error between the predicted velocity and the target ``noise - x_0`` (fp32)."""
    target = (noise_BLP - x0_BLP).float()
    return torch.mean((velocity_BLP.float() - target) ** 2)


def sampling_schedule(steps: int, image_tokens: int, shift: bool = True) -> torch.Tensor:
    """Timesteps from noise to data for an Euler sampler: ``steps + 1`` values from 1 down to 0, shifted."""
    t = torch.linspace(1.0, 0.0, steps + 1)
    return shift_timesteps(t, shift_mu(image_tokens)) if shift else t


@torch.no_grad()
def euler_sample(velocity, noise_BLP: torch.Tensor, schedule: torch.Tensor) -> torch.Tensor:
    """Integrate ``dx/dt = velocity(x, t)`` from ``t = schedule[0]`` (noise) to ``schedule[-1]`` (data).

    ``velocity(x_BLP, t_B)`` is the model with its text conditioning bound.
    """
    x = noise_BLP
    for t, t_next in zip(schedule[:-1].tolist(), schedule[1:].tolist(), strict=True):
        t_B = torch.full((x.shape[0],), t, dtype=x.dtype, device=x.device)
        x = x + (t_next - t) * velocity(x, t_B)
    return x


class FlowMatchingModel(torch.nn.Module):
    """A FLUX transformer with its training objective: ``loss(**batch)`` is the velocity MSE.

    The batch holds clean ``latents`` and ``noise`` (both packed, [B, L, P]), ``timesteps``
    [B], the text conditioning (``text`` [B, T, D], ``pooled`` [B, D_pooled]), position ids
    (``img_ids`` [L, 3], ``txt_ids`` [T, 3]) and, for a guidance-distilled model, ``guidance`` [B].
    Noise and timesteps come with the batch, so a step is a pure function of its inputs.
    """

    shared_batch_inputs = ("img_ids", "txt_ids")
    """The batch entries without a batch dimension (one per token, shared by every sample): a step that splits
    the batch over devices gives these whole to each."""

    def __init__(self, transformer: torch.nn.Module) -> None:
        super().__init__()
        self.transformer = transformer

    def velocity(
        self,
        x_BLP: torch.Tensor,
        t_B: torch.Tensor,
        text: torch.Tensor,
        pooled: torch.Tensor,
        img_ids: torch.Tensor,
        txt_ids: torch.Tensor,
        guidance: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The transformer's predicted velocity at ``x_BLP``, time ``t_B``."""
        return self.transformer(x_BLP, img_ids, text, txt_ids, t_B, pooled, guidance)

    def loss(
        self,
        latents: torch.Tensor,
        noise: torch.Tensor,
        timesteps: torch.Tensor,
        text: torch.Tensor,
        pooled: torch.Tensor,
        img_ids: torch.Tensor,
        txt_ids: torch.Tensor,
        guidance: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean squared error of the predicted velocity at ``(1 - t) latents + t noise`` against ``noise - latents``."""
        x_t = noisy_latents(latents, noise, timesteps)
        velocity = self.velocity(x_t, timesteps, text, pooled, img_ids, txt_ids, guidance)
        return flow_matching_loss(velocity, latents, noise)
