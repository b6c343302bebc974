"""config.json <-> ``DecoderArgs`` for a Hugging Face decoder class (Llama, Qwen3, Qwen3Moe and their kin),
given the ``DecoderHFForm`` that names the class and what its config implies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from titanpod.models.adapters.base import UnsupportedConfigError
from titanpod.models.common.args import DecoderArgs, MoEArgs
from titanpod.models.common.rope_scaling import Llama3RopeScaling


@dataclass(frozen=True)
class DecoderHFForm:
    """How one decoder family looks in Hugging Face's transformers: its class and what its config.json implies."""

    architecture: str
    """transformers' class name written into ``architectures``, e.g. ``LlamaForCausalLM``."""
    model_type: str
    """config.json's ``model_type``, e.g. ``llama``."""
    qk_norm: bool = False
    """The class normalises queries and keys per head (Qwen 3): read into ``DecoderArgs.qk_norm``."""
    moe: bool = False
    """The class has routed experts in every layer (Qwen 3 MoE): config.json's expert fields are read."""
    extra_config: tuple[tuple[str, Any], ...] = ()
    """Fixed (key, value) pairs the published checkpoints' config.json carries, written as they are."""
    sliding_window: bool = False
    """The class can attend through a sliding window in every layer (config.json's ``use_sliding_window``)."""

    def describes(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` is this class's: its ``architectures`` name it, or (none listed) its ``model_type``."""
        architectures = config.get("architectures") or []
        return self.architecture in architectures or (not architectures and config.get("model_type") == self.model_type)


def family_of_hf_config(config: Mapping[str, Any], forms: Mapping[str, DecoderHFForm]) -> str:
    """The family (a key of ``forms``) whose Hugging Face class ``config`` describes; ``UnsupportedConfigError``
    otherwise."""
    for family, form in forms.items():
        if form.describes(config):
            return family
    known = ", ".join(form.architecture for form in forms.values())
    described = config.get("architectures") or config.get("model_type")
    raise UnsupportedConfigError(
        f"config.json describes {described!r}, which titanpod does not read; supported: {known}."
    )


def _rope(config: Mapping[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    parameters = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", parameters.get("rope_theta"))
    if theta is None:
        raise UnsupportedConfigError("config.json has neither rope_theta nor rope_parameters.rope_theta.")
    scaling = config.get("rope_scaling") or parameters
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise UnsupportedConfigError(
            f"RoPE type {rope_type!r} is not supported; titanpod reads 'default' and 'llama3'."
        )
    return float(theta), Llama3RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )


def _require(config: Mapping[str, Any], key: str, allowed: object, default: object) -> None:
    value = config.get(key, default)
    if value != allowed:
        raise UnsupportedConfigError(f"config.json sets {key}={value!r}; titanpod supports only {allowed!r}.")


def _moe(config: Mapping[str, Any]) -> MoEArgs:
    _require(config, "decoder_sparse_step", 1, 1)
    _require(config, "mlp_only_layers", [], [])
    return MoEArgs(
        n_experts=int(config.get("num_experts", config.get("num_local_experts", 0))),
        top_k=int(config["num_experts_per_tok"]),
        expert_ffn_dim=int(config["moe_intermediate_size"]),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        aux_loss_coef=float(config.get("router_aux_loss_coef", 0.001)),
    )


def args_from_hf_config(config: Mapping[str, Any], form: DecoderHFForm) -> DecoderArgs:
    """The ``DecoderArgs`` of a Hugging Face config.json (as a dict) of the class ``form`` describes.

    Raises ``UnsupportedConfigError`` naming the field for anything that would change the
    arithmetic and that titanpod does not implement (biases, other activations, sliding
    windows, other RoPE types, dense layers inside an MoE model).
    """
    _require(config, "hidden_act", "silu", "silu")
    _require(config, "attention_bias", False, False)
    _require(config, "mlp_bias", False, False)
    _require(config, "use_sliding_window", False, False)
    theta, scaling = _rope(config)
    head_dim = config.get("head_dim")
    if head_dim is not None and int(head_dim) * int(config["num_attention_heads"]) == int(config["hidden_size"]):
        head_dim = None  # the default; keeps args equal to the named flavors
    args = DecoderArgs(
        dim=int(config["hidden_size"]),
        n_layers=int(config["num_hidden_layers"]),
        n_heads=int(config["num_attention_heads"]),
        n_kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        vocab_size=int(config["vocab_size"]),
        ffn_dim=int(config["intermediate_size"]),
        head_dim=None if head_dim is None else int(head_dim),
        norm_eps=float(config["rms_norm_eps"]),
        rope_theta=theta,
        rope_scaling=scaling,
        max_seq_len=int(config.get("max_position_embeddings", 8192)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        qk_norm=form.qk_norm,
        moe=_moe(config) if form.moe else None,
    )
    return args


def sliding_window_config(form: DecoderHFForm, window: int | None) -> dict[str, Any]:
    """config.json's fields for attention that sees ``window`` keys before each query (``kernels.window``) in
    every layer; none for ``None``. ``UnsupportedConfigError`` where ``form``'s class has no sliding window, as
    transformers would then attend to every earlier key and compute another model."""
    if window is None:
        return {}
    if not form.sliding_window:
        raise UnsupportedConfigError(
            f"kernels.window {window}: transformers' {form.architecture} has no sliding window, so its export would "
            "attend to every earlier key and give other logits than the trained model. Leave out the Hugging Face "
            "export (titanpod's own model/ folder keeps the window), train without --kernels.window, or train a "
            "family whose class has one (qwen3, qwen3_moe)."
        )
    # transformers' window counts the query's own key: query i sees keys i - sliding_window + 1 .. i.
    return {"use_sliding_window": True, "sliding_window": window + 1, "max_window_layers": 0}


def hf_config_from_args(form: DecoderHFForm, args: DecoderArgs, dtype: str = "float32") -> dict[str, Any]:
    """A Hugging Face config.json (as a dict) of ``form``'s class for ``args``, in the published checkpoints'
    style."""
    config: dict[str, Any] = {
        "architectures": [form.architecture],
        "model_type": form.model_type,
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "vocab_size": args.vocab_size,
        "intermediate_size": args.ffn_dim,
        "head_dim": args.resolved_head_dim,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "max_position_embeddings": args.max_seq_len,
        "tie_word_embeddings": args.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "dtype": dtype,
    }
    config.update(form.extra_config)
    if args.rope_scaling is not None:
        scaling = args.rope_scaling
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    if args.moe is not None:
        config.update(
            num_experts=args.moe.n_experts,
            num_experts_per_tok=args.moe.top_k,
            moe_intermediate_size=args.moe.expert_ffn_dim,
            norm_topk_prob=args.moe.norm_topk_prob,
            router_aux_loss_coef=args.moe.aux_loss_coef,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return config
