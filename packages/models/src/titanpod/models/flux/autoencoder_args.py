"""Shapes of the FLUX.1 autoencoder: ``FluxAutoencoderArgs`` and its named flavors."""

from __future__ import annotations

from dataclasses import dataclass


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
