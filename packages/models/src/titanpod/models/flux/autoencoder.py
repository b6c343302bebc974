"""The FLUX.1 autoencoder: a KL-regularised convolutional VAE (diffusers' ``AutoencoderKL`` as
FLUX.1 configures it, without the 1x1 quant convs), in plain single-device PyTorch.

Legend: B batch, C channels, H height, W width, L latent channels, P spatial positions (H x W).

Images are in [-1, 1]. The encoder halves the resolution at every level but the last
(``downsample_factor``, 8 for FLUX) and ends in a diagonal Gaussian over the latents; the
decoder mirrors it with nearest-neighbour upsampling. The FLUX transformer does not see raw
latents but ``to_model_space(latents)`` = (latents - shift_factor) x scaling_factor.

Build on the meta device (``build_flux_autoencoder``), move with ``to_empty``, then
``init_weights``. The Hugging Face (diffusers) adapter is here too: ``config.json`` <-> args
and tensor names; reading and writing the files lives in ``titanpod.checkpoint``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class FluxAutoencoderArgs:
    """Everything that fixes the autoencoder's parameters and arithmetic."""

    in_channels: int = 3
    """Channels of the images the encoder reads."""
    out_channels: int = 3
    """Channels of the images the decoder writes."""
    latent_channels: int = 16
    """Channels of the latents; the FLUX transformer packs 2 x 2 of them into one token (16 x 4 = 64)."""
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    """Width of each resolution level, finest first; every level but the last halves H and W."""
    layers_per_block: int = 2
    """Residual blocks per encoder level (the decoder has one more per level)."""
    norm_num_groups: int = 32
    """Groups of every GroupNorm; divides every entry of ``block_out_channels``."""
    norm_eps: float = 1e-6
    """Epsilon of every GroupNorm."""
    scaling_factor: float = 0.3611
    """Multiplies shifted latents so the transformer sees roughly unit variance."""
    shift_factor: float = 0.1159
    """Subtracted from latents before scaling (the latents' mean)."""
    sample_size: int = 1024
    """Image side the autoencoder was trained at; recorded in config.json, not used in the arithmetic."""
    force_upcast: bool = True
    """Hint for pipelines to run this autoencoder in float32; recorded in config.json, not used here."""

    def __post_init__(self) -> None:
        if not self.block_out_channels:
            raise ValueError("block_out_channels must name at least one level.")
        for name in ("in_channels", "out_channels", "latent_channels", "layers_per_block", "norm_num_groups"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")
        uneven = [c for c in self.block_out_channels if c % self.norm_num_groups]
        if uneven:
            raise ValueError(
                f"norm_num_groups ({self.norm_num_groups}) must divide every block_out_channels entry; "
                f"it does not divide {uneven}."
            )

    @property
    def downsample_factor(self) -> int:
        """Image side / latent side: 2 per level but the last."""
        return 2 ** (len(self.block_out_channels) - 1)


FLUX_AUTOENCODER_FLAVORS: dict[str, FluxAutoencoderArgs] = {
    # Tiny, for CPU tests and the debug recipe; the same 8x downsampling and 16 latent channels as FLUX.
    "debug": FluxAutoencoderArgs(
        block_out_channels=(32, 32, 64, 64), layers_per_block=1, norm_num_groups=8, sample_size=64
    ),
    # black-forest-labs/FLUX.1-dev and FLUX.1-schnell, subfolder vae.
    "flux": FluxAutoencoderArgs(),
}
"""Flavor name -> shape."""


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


# ---------------------------------------------------------------------------------------------
# Hugging Face (diffusers AutoencoderKL): config.json <-> args, tensor names.

DIFFUSERS_CLASS = "AutoencoderKL"
"""``_class_name`` of the config.json this adapter reads and writes."""


DIFFUSERS_NORM_EPS = 1e-6
"""The GroupNorm epsilon diffusers' ``AutoencoderKL`` always uses."""


class UnsupportedAutoencoderConfigError(ValueError):
    """A diffusers config.json describes an autoencoder titanpod cannot represent exactly."""


# Keys that become args, with diffusers' default when absent and the type they must have.
_ARG_KEYS: dict[str, tuple[Any, type]] = {
    "in_channels": (3, int),
    "out_channels": (3, int),
    "latent_channels": (4, int),
    "layers_per_block": (1, int),
    "norm_num_groups": (32, int),
    "scaling_factor": (0.18215, float),
    "sample_size": (32, int),
    "force_upcast": (True, bool),
}
# Keys whose only supported value is fixed: (that value, diffusers' default when absent).
_FIXED: dict[str, tuple[Any, Any]] = {
    "act_fn": ("silu", "silu"),
    "use_quant_conv": (False, True),
    "use_post_quant_conv": (False, True),
    "mid_block_add_attention": (True, True),
    "latents_mean": (None, None),
    "latents_std": (None, None),
}
_METADATA = {"_class_name", "_diffusers_version", "_name_or_path", "_use_default_values"}


def _fail(key: str, value: object, supported: str) -> UnsupportedAutoencoderConfigError:
    return UnsupportedAutoencoderConfigError(
        f"config.json sets {key}={value!r}; the FLUX autoencoder supports only {supported}."
    )


def autoencoder_args_from_diffusers_config(config: dict[str, Any]) -> FluxAutoencoderArgs:
    """``FluxAutoencoderArgs`` of a diffusers ``AutoencoderKL`` config.json (as a dict).

    Strict: an unknown key, or a value that would change the arithmetic in a way this model
    does not implement (quant convs, other activations or block types, latent statistics),
    is an ``UnsupportedAutoencoderConfigError`` naming the key. Keys left out take diffusers'
    defaults, so a config without ``use_quant_conv`` is refused (diffusers defaults it to true).
    """
    class_name = config.get("_class_name", DIFFUSERS_CLASS)
    if class_name != DIFFUSERS_CLASS:
        raise _fail("_class_name", class_name, repr(DIFFUSERS_CLASS))
    known = {
        *_ARG_KEYS,
        *_FIXED,
        *_METADATA,
        "block_out_channels",
        "down_block_types",
        "up_block_types",
        "shift_factor",
    }
    unknown = sorted(set(config) - known)
    if unknown:
        raise UnsupportedAutoencoderConfigError(
            f"config.json has keys the FLUX autoencoder does not know: {', '.join(unknown)}."
        )
    for key, (supported, default) in _FIXED.items():
        value = config.get(key, default)
        if value != supported:
            raise _fail(key, value, repr(supported))
    widths = config.get("block_out_channels", [64])
    if not isinstance(widths, (list, tuple)) or not widths or not all(_is(w, int) for w in widths):
        raise _fail("block_out_channels", widths, "a non-empty list of integers")
    for key, block in (("down_block_types", "DownEncoderBlock2D"), ("up_block_types", "UpDecoderBlock2D")):
        value = config.get(key, [block])
        if not isinstance(value, (list, tuple)) or list(value) != [block] * len(widths):
            raise _fail(key, value, f"{len(widths)} x {block!r} (one per block_out_channels entry)")
    values: dict[str, Any] = {}
    for key, (default, kind) in _ARG_KEYS.items():
        value = config.get(key, default)
        if not _is(value, kind):
            raise _fail(key, value, f"a value of type {kind.__name__}")
        values[key] = kind(value)
    shift = config.get("shift_factor")
    if shift is not None and not _is(shift, float):
        raise _fail("shift_factor", shift, "a number or null")
    try:
        return FluxAutoencoderArgs(
            block_out_channels=tuple(widths), shift_factor=0.0 if shift is None else float(shift), **values
        )
    except ValueError as error:
        raise UnsupportedAutoencoderConfigError(
            f"config.json does not describe a valid autoencoder: {error}"
        ) from error


def _is(value: object, kind: type) -> bool:
    """JSON typing: bools are not numbers, integers are acceptable floats."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, int) if kind is int else isinstance(value, (int, float))


def diffusers_config_from_autoencoder_args(args: FluxAutoencoderArgs) -> dict[str, Any]:
    """The diffusers ``AutoencoderKL`` config.json (as a dict) of ``args``.

    diffusers fixes the GroupNorm epsilon at 1e-6, so other ``norm_eps`` values cannot be written.
    """
    if args.norm_eps != DIFFUSERS_NORM_EPS:
        raise UnsupportedAutoencoderConfigError(
            f"norm_eps={args.norm_eps} cannot be written to a diffusers config.json: AutoencoderKL fixes it at 1e-6."
        )
    levels = len(args.block_out_channels)
    config: dict[str, Any] = {"_class_name": DIFFUSERS_CLASS}
    config.update({key: getattr(args, key) for key in _ARG_KEYS})
    config.update(
        block_out_channels=list(args.block_out_channels),
        down_block_types=["DownEncoderBlock2D"] * levels,
        up_block_types=["UpDecoderBlock2D"] * levels,
        shift_factor=args.shift_factor,
    )
    config.update({key: supported for key, (supported, _) in _FIXED.items()})
    return dict(sorted(config.items()))


# titanpod name -> diffusers name, applied in order to dotted parameter names.
_RENAMES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"^encoder\.down\.(\d+)\.", r"encoder.down_blocks.\1."),
        (r"^decoder\.up\.(\d+)\.", r"decoder.up_blocks.\1."),
        (r"^(encoder\.down_blocks\.\d+)\.resample\.", r"\1.downsamplers.0."),
        (r"^(decoder\.up_blocks\.\d+)\.resample\.", r"\1.upsamplers.0."),
        (r"\.shortcut\.", ".conv_shortcut."),
        (r"\.mid\.resnet1\.", ".mid_block.resnets.0."),
        (r"\.mid\.resnet2\.", ".mid_block.resnets.1."),
        (r"\.mid\.attention\.norm\.", ".mid_block.attentions.0.group_norm."),
        (r"\.mid\.attention\.([qkv])\.", r".mid_block.attentions.0.to_\1."),
        (r"\.mid\.attention\.proj\.", ".mid_block.attentions.0.to_out.0."),
        (r"\.norm_out\.", ".conv_norm_out."),
    )
)


def diffusers_name(name: str) -> str:
    """The diffusers ``AutoencoderKL`` name of a titanpod autoencoder parameter name."""
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    return name


def diffusers_names(model: FluxAutoencoder) -> dict[str, str]:
    """diffusers tensor name -> titanpod parameter name, for every parameter of ``model`` (works on meta)."""
    return {diffusers_name(name): name for name, _ in model.named_parameters()}


def diffusers_tensors(model: FluxAutoencoder) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter of ``model`` under its diffusers name."""
    for name, param in model.named_parameters():
        yield diffusers_name(name), param
