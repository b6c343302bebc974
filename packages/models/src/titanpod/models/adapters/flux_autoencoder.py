"""The Hugging Face adapter of the FLUX.1 autoencoder (diffusers ``AutoencoderKL``): config.json <->
``FluxAutoencoderArgs``, and tensor names titanpod <-> diffusers (one to one, renamed).

Reading and writing the files lives in titanpod.checkpoint (``flux_autoencoder_files``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from titanpod.models.adapters.base import HFSlot, StateDictAdapter, UnsupportedConfigError
from titanpod.models.flux.autoencoder_args import FluxAutoencoderArgs

if TYPE_CHECKING:
    import torch

    from titanpod.models.flux.autoencoder import FluxAutoencoder

DIFFUSERS_CLASS = "AutoencoderKL"
"""``_class_name`` of the config.json this adapter reads and writes."""


DIFFUSERS_NORM_EPS = 1e-6
"""The GroupNorm epsilon diffusers' ``AutoencoderKL`` always uses."""


class UnsupportedAutoencoderConfigError(UnsupportedConfigError):
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


def autoencoder_args_from_diffusers_config(config: Mapping[str, Any]) -> FluxAutoencoderArgs:
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


@lru_cache(maxsize=8)
def autoencoder_hf_layout(args: FluxAutoencoderArgs) -> Mapping[str, HFSlot]:
    """Every diffusers tensor name of an autoencoder of shape ``args`` -> its titanpod parameter, in
    parameter order. Cached per ``args`` and read-only."""
    from titanpod.models.flux.autoencoder import build_flux_autoencoder  # here: the adapter is read without torch

    model = build_flux_autoencoder(args, device="meta")
    return MappingProxyType({diffusers_name(name): HFSlot(name) for name, _ in model.named_parameters()})


def diffusers_names(model: FluxAutoencoder) -> dict[str, str]:
    """diffusers tensor name -> titanpod parameter name, for every parameter of ``model`` (works on meta)."""
    return {hf_name: slot.name for hf_name, slot in autoencoder_hf_layout(model.args).items()}


def diffusers_tensors(model: FluxAutoencoder) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter of ``model`` under its diffusers name."""
    return FLUX_AUTOENCODER_ADAPTER.to_hf(dict(model.named_parameters()), model.args)


class FluxAutoencoderAdapter(StateDictAdapter[FluxAutoencoderArgs]):
    """The diffusers ``AutoencoderKL`` form of the FLUX.1 autoencoder."""

    def args_from_hf_config(self, config: Mapping[str, Any]) -> FluxAutoencoderArgs:
        """See ``autoencoder_args_from_diffusers_config``."""
        return autoencoder_args_from_diffusers_config(config)

    def hf_config_from_args(self, args: FluxAutoencoderArgs, dtype: torch.dtype) -> dict[str, Any]:
        """See ``diffusers_config_from_autoencoder_args``; diffusers' config.json has no dtype field, so
        ``dtype`` is not recorded."""
        return diffusers_config_from_autoencoder_args(args)

    def hf_layout(self, args: FluxAutoencoderArgs) -> Mapping[str, HFSlot]:
        """See ``autoencoder_hf_layout``."""
        return autoencoder_hf_layout(args)


FLUX_AUTOENCODER_ADAPTER = FluxAutoencoderAdapter()
"""The one instance; the adapter holds no state."""
