"""The Hugging Face adapter of the FLUX.1 transformer (diffusers ``FluxTransformer2DModel``).

config.json <-> ``FluxArgs``, and tensor names titanpod <-> diffusers. Reading and writing
files lives in titanpod.checkpoint (``flux_files``); this module only translates.

Most tensors map one to one. A single-stream block's fused ``linear1`` is four diffusers
tensors stacked along rows (``attn.to_q``, ``attn.to_k``, ``attn.to_v``, ``proj_mlp``);
a diffusers name therefore maps to a titanpod parameter and, for those, a row range.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from titanpod.models.adapters.base import HFSlot, StateDictAdapter, UnsupportedConfigError
from titanpod.models.flux.args import FluxArgs

if TYPE_CHECKING:
    import torch

    from titanpod.models.flux.transformer import FluxTransformer

DIFFUSERS_CLASS = "FluxTransformer2DModel"
"""The diffusers class whose checkpoints this adapter reads and writes."""

_DEFAULTS: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 64,
    "out_channels": None,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": False,
    "axes_dims_rope": [16, 56, 56],
}
"""Every config key of ``FluxTransformer2DModel`` and the value diffusers assumes when it is absent."""

_FIXED: dict[str, object] = {
    "mlp_ratio": 4.0,
    "rope_theta": 10000.0,
    "qkv_bias": True,
    "time_channels": 256,
    "norm_eps": 1e-6,
}
"""``FluxArgs`` fields diffusers hard-codes, at the value it uses."""


def _check_representable(args: FluxArgs) -> None:
    for field, value in _FIXED.items():
        if getattr(args, field) != value:
            raise UnsupportedConfigError(
                f"FluxArgs.{field}={getattr(args, field)!r} has no {DIFFUSERS_CLASS} form; diffusers fixes it at "
                f"{value!r}."
            )


def _int(config: Mapping[str, Any], key: str, minimum: int = 1) -> int:
    value = config.get(key, _DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UnsupportedConfigError(f"config.json sets {key}={value!r}; expected an integer >= {minimum}.")
    return value


def flux_args_from_hf_config(config: Mapping[str, Any]) -> FluxArgs:
    """``FluxArgs`` of a diffusers ``FluxTransformer2DModel`` config.json (as a dict).

    Absent keys take diffusers' defaults (the published checkpoints omit some). Keys that
    start with ``_`` are bookkeeping and skipped, except that ``_class_name``, when given,
    must be ``FluxTransformer2DModel``. Any other unknown key, or a value titanpod does not
    implement (``patch_size`` other than 1, rotary widths that do not sum to the head
    width), is an ``UnsupportedConfigError`` naming the key.
    """
    class_name = config.get("_class_name", DIFFUSERS_CLASS)
    if class_name != DIFFUSERS_CLASS:
        raise UnsupportedConfigError(
            f"config.json describes _class_name={class_name!r}; this reader takes {DIFFUSERS_CLASS} only."
        )
    unknown = sorted(key for key in config if not key.startswith("_") and key not in _DEFAULTS)
    if unknown:
        raise UnsupportedConfigError(
            f"config.json has keys {DIFFUSERS_CLASS} does not define, which titanpod will not guess at: "
            f"{', '.join(unknown)}."
        )
    if config.get("patch_size", 1) != 1:
        raise UnsupportedConfigError(
            f"config.json sets patch_size={config['patch_size']!r}; titanpod supports only 1 "
            f"(FLUX patches latents 2 x 2 outside the transformer)."
        )
    guidance = config.get("guidance_embeds", False)
    if not isinstance(guidance, bool):
        raise UnsupportedConfigError(f"config.json sets guidance_embeds={guidance!r}; expected true or false.")
    axes = config.get("axes_dims_rope", _DEFAULTS["axes_dims_rope"])
    if not isinstance(axes, (list, tuple)) or not all(isinstance(w, int) and not isinstance(w, bool) for w in axes):
        raise UnsupportedConfigError(f"config.json sets axes_dims_rope={axes!r}; expected a list of integers.")
    in_channels = _int(config, "in_channels")
    out_channels = None if config.get("out_channels") is None else _int(config, "out_channels")
    heads, head_dim = _int(config, "num_attention_heads"), _int(config, "attention_head_dim")
    if sum(axes) != head_dim or any(w % 2 for w in axes):
        raise UnsupportedConfigError(
            f"config.json sets axes_dims_rope={list(axes)}; its entries must be even and sum to "
            f"attention_head_dim ({head_dim})."
        )
    return FluxArgs(
        in_channels=in_channels,
        out_channels=None if out_channels == in_channels else out_channels,
        dim=heads * head_dim,
        n_heads=heads,
        head_dim=head_dim,
        depth=_int(config, "num_layers", minimum=0),
        depth_single=_int(config, "num_single_layers", minimum=0),
        context_dim=_int(config, "joint_attention_dim"),
        pooled_dim=_int(config, "pooled_projection_dim"),
        axes_dims=tuple(axes),
        guidance_embed=guidance,
    )


def flux_hf_config_from_args(args: FluxArgs) -> dict[str, Any]:
    """A diffusers ``FluxTransformer2DModel`` config.json (as a dict) for ``args``.

    diffusers fixes the MLP ratio (4), RoPE theta (10000), q/k/v biases (on), the
    sinusoid width (256) and the norms' epsilon (1e-6); args that differ cannot be written
    and raise ``UnsupportedConfigError`` naming the field.
    """
    _check_representable(args)
    return {
        "_class_name": DIFFUSERS_CLASS,
        "patch_size": 1,
        "in_channels": args.in_channels,
        "out_channels": args.out_channels,
        "num_layers": args.depth,
        "num_single_layers": args.depth_single,
        "attention_head_dim": args.head_dim,
        "num_attention_heads": args.n_heads,
        "joint_attention_dim": args.context_dim,
        "pooled_projection_dim": args.pooled_dim,
        "guidance_embeds": args.guidance_embed,
        "axes_dims_rope": list(args.axes_dims),
    }


_EMBEDDERS = {
    "x_embedder": "img_in",
    "context_embedder": "txt_in",
    "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
    "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
    "norm_out.linear": "final_layer.modulation",
    "proj_out": "final_layer.linear",
}
_GUIDANCE = {
    "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
}
_DOUBLE_LINEARS = {
    "norm1.linear": "img_mod",
    "norm1_context.linear": "txt_mod",
    "attn.to_q": "img_attn.wq",
    "attn.to_k": "img_attn.wk",
    "attn.to_v": "img_attn.wv",
    "attn.to_out.0": "img_attn.wo",
    "attn.add_q_proj": "txt_attn.wq",
    "attn.add_k_proj": "txt_attn.wk",
    "attn.add_v_proj": "txt_attn.wv",
    "attn.to_add_out": "txt_attn.wo",
    "ff.net.0.proj": "img_mlp.w1",
    "ff.net.2": "img_mlp.w2",
    "ff_context.net.0.proj": "txt_mlp.w1",
    "ff_context.net.2": "txt_mlp.w2",
}
_DOUBLE_NORMS = {
    "attn.norm_q": "img_attn.q_norm",
    "attn.norm_k": "img_attn.k_norm",
    "attn.norm_added_q": "txt_attn.q_norm",
    "attn.norm_added_k": "txt_attn.k_norm",
}
_SINGLE_LINEARS = {"norm.linear": "modulation", "proj_out": "linear2"}
_SINGLE_NORMS = {"attn.norm_q": "q_norm", "attn.norm_k": "k_norm"}
_SINGLE_FUSED = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
"""diffusers' pieces of a single-stream block's ``linear1``, in row order."""


@lru_cache(maxsize=8)
def flux_hf_layout(args: FluxArgs) -> Mapping[str, HFSlot]:
    """Every diffusers tensor name of a model of shape ``args`` -> its titanpod slot.

    The layout is complete: each titanpod parameter's rows are covered exactly once. It is
    cached per ``args`` and read-only.
    Args diffusers cannot represent raise ``UnsupportedConfigError`` naming the field.
    """
    _check_representable(args)
    layout: dict[str, HFSlot] = {}

    def linear(theirs: str, ours: str, rows: tuple[int, int] | None = None) -> None:
        layout[f"{theirs}.weight"] = HFSlot(f"{ours}.weight", rows=rows)
        layout[f"{theirs}.bias"] = HFSlot(f"{ours}.bias", rows=rows)

    embedders = {**_EMBEDDERS, **(_GUIDANCE if args.guidance_embed else {})}
    for theirs, ours in embedders.items():
        linear(theirs, ours)
    for i in range(args.depth):
        for theirs, ours in _DOUBLE_LINEARS.items():
            linear(f"transformer_blocks.{i}.{theirs}", f"double_blocks.{i}.{ours}")
        for theirs, ours in _DOUBLE_NORMS.items():
            layout[f"transformer_blocks.{i}.{theirs}.weight"] = HFSlot(f"double_blocks.{i}.{ours}.weight")
    widths = (args.dim, args.dim, args.dim, args.mlp_dim)
    for i in range(args.depth_single):
        for theirs, ours in _SINGLE_LINEARS.items():
            linear(f"single_transformer_blocks.{i}.{theirs}", f"single_blocks.{i}.{ours}")
        for theirs, ours in _SINGLE_NORMS.items():
            layout[f"single_transformer_blocks.{i}.{theirs}.weight"] = HFSlot(f"single_blocks.{i}.{ours}.weight")
        start = 0
        for theirs, width in zip(_SINGLE_FUSED, widths, strict=True):
            linear(f"single_transformer_blocks.{i}.{theirs}", f"single_blocks.{i}.linear1", (start, start + width))
            start += width
    return MappingProxyType(layout)


def flux_hf_name_to_slot(hf_name: str, args: FluxArgs) -> HFSlot | None:
    """The titanpod slot of a diffusers tensor name, or ``None`` if a model of shape ``args`` has no such tensor."""
    return flux_hf_layout(args).get(hf_name)


def flux_hf_tensors(model: FluxTransformer) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``model`` under its diffusers name, fused rows split (views, no copies)."""
    return FLUX_TRANSFORMER_ADAPTER.to_hf(dict(model.named_parameters()), model.args)


class FluxTransformerAdapter(StateDictAdapter[FluxArgs]):
    """The diffusers ``FluxTransformer2DModel`` form of the FLUX.1 transformer."""

    def args_from_hf_config(self, config: Mapping[str, Any]) -> FluxArgs:
        """See ``flux_args_from_hf_config``."""
        return flux_args_from_hf_config(config)

    def hf_config_from_args(self, args: FluxArgs, dtype: torch.dtype) -> dict[str, Any]:
        """See ``flux_hf_config_from_args``; diffusers' config.json has no dtype field, so ``dtype`` is not recorded."""
        return flux_hf_config_from_args(args)

    def hf_layout(self, args: FluxArgs) -> Mapping[str, HFSlot]:
        """See ``flux_hf_layout``."""
        return flux_hf_layout(args)


FLUX_TRANSFORMER_ADAPTER = FluxTransformerAdapter()
"""The one instance; the adapter holds no state."""
