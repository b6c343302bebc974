"""The FLUX.1 autoencoder: a KL-regularised convolutional VAE (diffusers' ``AutoencoderKL`` as
FLUX.1 configures it, without the 1x1 quant convs), in plain single-device PyTorch.

Legend: B batch, C channels, H height, W width, L latent channels, P spatial positions (H x W).

Images are in [-1, 1]. The encoder halves the resolution at every level but the last
(``downsample_factor``, 8 for FLUX) and ends in a diagonal Gaussian over the latents; the
decoder mirrors it with nearest-neighbour upsampling. The FLUX transformer does not see raw
latents but ``to_model_space(latents)`` = (latents - shift_factor) x scaling_factor.

Build on the meta device (``build_flux_autoencoder``), move with ``to_empty``, then
``init_weights``. Its shapes are in ``autoencoder_args``; its Hugging Face (diffusers) adapter
is ``titanpod.models.adapters.flux_autoencoder``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from titanpod.models.flux.autoencoder_args import FLUX_AUTOENCODER_FLAVORS, FluxAutoencoderArgs

__all__ = [
    "FLUX_AUTOENCODER_FLAVORS",
    "DiagonalGaussian",
    "FluxAutoencoder",
    "FluxAutoencoderArgs",
    "build_flux_autoencoder",
]


def _group_norm(channels: int, args: FluxAutoencoderArgs) -> nn.GroupNorm:
    return nn.GroupNorm(args.norm_num_groups, channels, eps=args.norm_eps)


class ResnetBlock(nn.Module):
    """Two (GroupNorm, SiLU, 3x3 conv) steps added to the input; a 1x1 conv matches widths if they differ."""

    def __init__(self, in_channels: int, out_channels: int, args: FluxAutoencoderArgs) -> None:
        super().__init__()
        self.norm1 = _group_norm(in_channels, args)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = _group_norm(out_channels, args)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        h_BCHW = self.conv1(F.silu(self.norm1(x_BCHW)))
        h_BCHW = self.conv2(F.silu(self.norm2(h_BCHW)))
        skip_BCHW = x_BCHW if self.shortcut is None else self.shortcut(x_BCHW)
        return skip_BCHW + h_BCHW


class SpatialSelfAttention(nn.Module):
    """One attention head over all H x W positions, channels as features, added to the input."""

    def __init__(self, channels: int, args: FluxAutoencoderArgs) -> None:
        super().__init__()
        self.norm = _group_norm(channels, args)
        self.q = nn.Linear(channels, channels)
        self.k = nn.Linear(channels, channels)
        self.v = nn.Linear(channels, channels)
        self.proj = nn.Linear(channels, channels)

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x_BCHW.shape
        normed_BPC = self.norm(x_BCHW).flatten(2).transpose(1, 2)
        q_B1PC, k_B1PC, v_B1PC = (proj(normed_BPC).unsqueeze(1) for proj in (self.q, self.k, self.v))
        attended_BPC = F.scaled_dot_product_attention(q_B1PC, k_B1PC, v_B1PC).squeeze(1)
        out_BCHW = self.proj(attended_BPC).transpose(1, 2).reshape(b, c, h, w)
        return x_BCHW + out_BCHW


class Downsample(nn.Module):
    """Halve H and W: pad one zero row and column at the bottom and right, then a 3x3 stride-2 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x_BCHW, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Double H and W by nearest-neighbour repetition, then a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x_BCHW, scale_factor=2.0, mode="nearest"))


class MidBlock(nn.Module):
    """At the coarsest level: residual block, spatial self-attention, residual block."""

    def __init__(self, channels: int, args: FluxAutoencoderArgs) -> None:
        super().__init__()
        self.resnet1 = ResnetBlock(channels, channels, args)
        self.attention = SpatialSelfAttention(channels, args)
        self.resnet2 = ResnetBlock(channels, channels, args)

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        return self.resnet2(self.attention(self.resnet1(x_BCHW)))


class Level(nn.Module):
    """One resolution level: residual blocks, then optionally a down- or upsampler."""

    def __init__(self, resnets: list[ResnetBlock], resample: nn.Module | None) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(resnets)
        self.resample = resample

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x_BCHW = resnet(x_BCHW)
        return x_BCHW if self.resample is None else self.resample(x_BCHW)


class Encoder(nn.Module):
    """Images [B, C_in, H, W] -> Gaussian parameters [B, 2L, H/f, W/f] (means, then log-variances)."""

    def __init__(self, args: FluxAutoencoderArgs) -> None:
        super().__init__()
        widths = args.block_out_channels
        self.conv_in = nn.Conv2d(args.in_channels, widths[0], 3, padding=1)
        levels = []
        for i, width in enumerate(widths):
            previous = widths[max(i - 1, 0)]
            resnets = [ResnetBlock(previous if j == 0 else width, width, args) for j in range(args.layers_per_block)]
            last = i == len(widths) - 1
            levels.append(Level(resnets, None if last else Downsample(width)))
        self.down = nn.ModuleList(levels)
        self.mid = MidBlock(widths[-1], args)
        self.norm_out = _group_norm(widths[-1], args)
        self.conv_out = nn.Conv2d(widths[-1], 2 * args.latent_channels, 3, padding=1)

    def forward(self, images_BCHW: torch.Tensor) -> torch.Tensor:
        h_BCHW = self.conv_in(images_BCHW)
        for level in self.down:
            h_BCHW = level(h_BCHW)
        h_BCHW = self.mid(h_BCHW)
        return self.conv_out(F.silu(self.norm_out(h_BCHW)))


class Decoder(nn.Module):
    """Latents [B, L, h, w] -> images [B, C_out, h x f, w x f]."""

    def __init__(self, args: FluxAutoencoderArgs) -> None:
        super().__init__()
        widths = tuple(reversed(args.block_out_channels))
        self.conv_in = nn.Conv2d(args.latent_channels, widths[0], 3, padding=1)
        self.mid = MidBlock(widths[0], args)
        levels = []
        for i, width in enumerate(widths):
            previous = widths[max(i - 1, 0)]
            resnets = [
                ResnetBlock(previous if j == 0 else width, width, args) for j in range(args.layers_per_block + 1)
            ]
            last = i == len(widths) - 1
            levels.append(Level(resnets, None if last else Upsample(width)))
        self.up = nn.ModuleList(levels)
        self.norm_out = _group_norm(widths[-1], args)
        self.conv_out = nn.Conv2d(widths[-1], args.out_channels, 3, padding=1)

    def forward(self, latents_BLHW: torch.Tensor) -> torch.Tensor:
        h_BCHW = self.mid(self.conv_in(latents_BLHW))
        for level in self.up:
            h_BCHW = level(h_BCHW)
        return self.conv_out(F.silu(self.norm_out(h_BCHW)))


LOGVAR_RANGE = (-30.0, 20.0)
"""Log-variances are clamped to this range, as diffusers does."""


@dataclass(frozen=True)
class DiagonalGaussian:
    """The encoder's posterior over latents: an independent normal per latent element."""

    mean: torch.Tensor
    """Means, [B, L, H, W]."""
    logvar: torch.Tensor
    """Log-variances, [B, L, H, W], clamped to ``LOGVAR_RANGE``."""

    @classmethod
    def from_parameters(cls, parameters_B2LHW: torch.Tensor) -> DiagonalGaussian:
        """Split the encoder's output into means (first L channels) and log-variances (last L)."""
        mean, logvar = parameters_B2LHW.chunk(2, dim=1)
        return cls(mean, logvar.clamp(*LOGVAR_RANGE))

    @property
    def std(self) -> torch.Tensor:
        """Standard deviations, exp(logvar / 2)."""
        return torch.exp(0.5 * self.logvar)

    def mode(self) -> torch.Tensor:
        """The most likely latents: the means."""
        return self.mean

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """mean + std x noise; the noise is drawn on ``generator``'s device (default: the means')."""
        device = generator.device if generator is not None else self.mean.device
        noise = torch.randn(self.mean.shape, generator=generator, device=device, dtype=self.mean.dtype)
        return self.mean + self.std * noise.to(self.mean.device)

    def kl(self) -> torch.Tensor:
        """KL divergence from the standard normal, summed over latent elements: shape [B]."""
        return 0.5 * (self.mean.pow(2) + self.logvar.exp() - 1.0 - self.logvar).sum(dim=(1, 2, 3))


class FluxAutoencoder(nn.Module):
    """The FLUX.1 VAE. ``encode`` gives a posterior over latents, ``decode`` gives images back."""

    def __init__(self, args: FluxAutoencoderArgs) -> None:
        super().__init__()
        self.args = args
        self.encoder = Encoder(args)
        self.decoder = Decoder(args)

    def encode(self, images_BCHW: torch.Tensor) -> DiagonalGaussian:
        """The posterior over latents of images in [-1, 1]; H and W must be multiples of ``downsample_factor``."""
        factor = self.args.downsample_factor
        if images_BCHW.ndim != 4 or images_BCHW.shape[1] != self.args.in_channels:
            raise ValueError(
                f"encode takes images [B, {self.args.in_channels}, H, W]; got shape {list(images_BCHW.shape)}."
            )
        if images_BCHW.shape[2] % factor or images_BCHW.shape[3] % factor:
            raise ValueError(
                f"Image height and width must be multiples of {factor} (the autoencoder's downsampling); "
                f"got {images_BCHW.shape[2]} x {images_BCHW.shape[3]}. Resize or crop the images."
            )
        return DiagonalGaussian.from_parameters(self.encoder(images_BCHW))

    def decode(self, latents_BLHW: torch.Tensor) -> torch.Tensor:
        """Images [B, C_out, H x f, W x f] (roughly in [-1, 1]) from raw latents (not model space)."""
        if latents_BLHW.ndim != 4 or latents_BLHW.shape[1] != self.args.latent_channels:
            raise ValueError(
                f"decode takes latents [B, {self.args.latent_channels}, H, W]; got shape {list(latents_BLHW.shape)}."
            )
        return self.decoder(latents_BLHW)

    def forward(
        self, images_BCHW: torch.Tensor, sample_posterior: bool = False, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Reconstructions: decode the posterior's mode, or a sample of it when ``sample_posterior``."""
        posterior = self.encode(images_BCHW)
        latents_BLHW = posterior.sample(generator) if sample_posterior else posterior.mode()
        return self.decode(latents_BLHW)

    def to_model_space(self, latents_BLHW: torch.Tensor) -> torch.Tensor:
        """What the FLUX transformer sees: (latents - shift_factor) x scaling_factor."""
        return (latents_BLHW - self.args.shift_factor) * self.args.scaling_factor

    def from_model_space(self, model_latents_BLHW: torch.Tensor) -> torch.Tensor:
        """Raw latents for ``decode`` from the transformer's: latents / scaling_factor + shift_factor."""
        return model_latents_BLHW / self.args.scaling_factor + self.args.shift_factor

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Initialise every parameter in place from ``seed``, on whatever device it lives.

        Conv and linear weights and biases are uniform in +-1/sqrt(fan_in) (PyTorch's own
        default for these layers); GroupNorm scales are one and shifts zero. Values are drawn
        on the CPU, so the same seed gives the same weights on every device type.
        """
        generator = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, nn.GroupNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
            elif isinstance(module, (nn.Conv2d, nn.Linear)):
                bound = 1.0 / math.sqrt(module.weight[0].numel())
                for param in (module.weight, module.bias):
                    values = torch.empty(param.shape).uniform_(-bound, bound, generator=generator)
                    param.copy_(values)


def build_flux_autoencoder(flavor: str | FluxAutoencoderArgs, device: torch.device | str = "meta") -> FluxAutoencoder:
    """Build the autoencoder at a named flavor (or explicit args), uninitialised.

    On the meta device (the default) nothing is allocated; move with
    ``model.to_empty(device=...)`` and call ``model.init_weights(seed)``.
    """
    if isinstance(flavor, str):
        if flavor not in FLUX_AUTOENCODER_FLAVORS:
            raise KeyError(
                f"Unknown FLUX autoencoder flavor {flavor!r}; choose one of {', '.join(FLUX_AUTOENCODER_FLAVORS)}."
            )
        flavor = FLUX_AUTOENCODER_FLAVORS[flavor]
    with torch.device(device):
        return FluxAutoencoder(flavor)
