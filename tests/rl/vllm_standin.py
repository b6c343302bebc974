"""A recording stand-in for exactly the part of vLLM that ``VLLMEngine`` calls, for machines without vLLM.

``standin_vllm()`` is a module to put in ``sys.modules["vllm"]``. Its ``LLM`` records the constructor's
arguments and every ``generate``, ``collective_rpc`` and ``reset_prefix_cache`` call, in order. It builds one
worker the way vLLM does: the class named by ``worker_extension_cls`` (imported by its path) mixed into a
worker whose ``model_runner.model`` is a real torch model laid out as vLLM's Llama / Qwen3 / Qwen3-MoE
classes lay out their weights (fused ``qkv_proj`` and ``gate_up_proj``, fused-MoE ``w13_weight`` /
``w2_weight``, embedding and head padded to 64 rows), loaded from the safetensors of the folder it is started
from, with a ``load_weights`` that puts each Hugging Face-named tensor where vLLM's loaders put it; the worker's
``reload_weights`` sends weights through it.
``collective_rpc`` accepts only a method name and plain data (tensors, bytes, numbers, strings, lists, tuples,
dicts), copies the tensors as vLLM's serializer would, and runs the method on that worker.
``generate`` returns made-up completions, seeded by each request's seed.
"""

from __future__ import annotations

import importlib
import json
import random
import re
import types
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from titanpod.checkpoint.hf_files import iter_hf_tensors
from titanpod.models.adapters import adapter_of_hf_config
from titanpod.recipes.families import decoder_adapters

PAD_TO = 64
"""vLLM pads the vocabulary rows of the embedding and the head to a multiple of this."""

_EXPERT = re.compile(r"^(.+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}


def padded(rows: int) -> int:
    """``rows`` rounded up to a multiple of ``PAD_TO``."""
    return -(-rows // PAD_TO) * PAD_TO


class VLLMLayoutModel(nn.Module):
    """A decoder's weights in vLLM's layout, built from a Hugging Face config.json (values random)."""

    def __init__(self, config: dict[str, Any], dtype: torch.dtype, seed: int = 123) -> None:
        super().__init__()
        args = adapter_of_hf_config(config, decoder_adapters()).args_from_hf_config(config)
        self.args = args
        head_dim, vocab = args.resolved_head_dim, padded(args.vocab_size)
        q_rows, kv_rows = args.n_heads * head_dim, args.n_kv_heads * head_dim
        self.row_ranges: dict[str, tuple[int, int]] = {
            "q_proj": (0, q_rows),
            "k_proj": (q_rows, q_rows + kv_rows),
            "v_proj": (q_rows + kv_rows, q_rows + 2 * kv_rows),
            "gate_proj": (0, args.ffn_dim),
            "up_proj": (args.ffn_dim, 2 * args.ffn_dim),
        }
        shapes = {"model.embed_tokens.weight": (vocab, args.dim), "model.norm.weight": (args.dim,)}
        if not args.tie_embeddings:
            shapes["lm_head.weight"] = (vocab, args.dim)
        for layer in range(args.n_layers):
            prefix = f"model.layers.{layer}"
            shapes[f"{prefix}.self_attn.qkv_proj.weight"] = (q_rows + 2 * kv_rows, args.dim)
            shapes[f"{prefix}.self_attn.o_proj.weight"] = (args.dim, q_rows)
            if args.qk_norm:
                shapes[f"{prefix}.self_attn.q_norm.weight"] = (head_dim,)
                shapes[f"{prefix}.self_attn.k_norm.weight"] = (head_dim,)
            shapes[f"{prefix}.input_layernorm.weight"] = (args.dim,)
            shapes[f"{prefix}.post_attention_layernorm.weight"] = (args.dim,)
            if args.moe is None:
                shapes[f"{prefix}.mlp.gate_up_proj.weight"] = (2 * args.ffn_dim, args.dim)
                shapes[f"{prefix}.mlp.down_proj.weight"] = (args.dim, args.ffn_dim)
            else:
                experts, width = args.moe.n_experts, args.moe.expert_ffn_dim
                shapes[f"{prefix}.mlp.gate.weight"] = (experts, args.dim)
                shapes[f"{prefix}.mlp.experts.w13_weight"] = (experts, 2 * width, args.dim)
                shapes[f"{prefix}.mlp.experts.w2_weight"] = (experts, args.dim, width)
        generator = torch.Generator().manual_seed(seed)
        for name, shape in shapes.items():
            self._register(name, nn.Parameter(torch.rand(shape, generator=generator).to(dtype), requires_grad=False))

    def _register(self, name: str, parameter: nn.Parameter) -> None:
        module: nn.Module = self
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, parameter)

    def _target(self, name: str, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """The part of a parameter that Hugging Face tensor ``name`` is loaded into (``KeyError`` if none)."""
        expert = _EXPERT.match(name)
        if expert is not None:
            layer, index, projection = expert.group(1), int(expert.group(2)), expert.group(3)
            if projection == "down_proj":
                return params[f"{layer}.w2_weight"][index]
            width = self.args.moe.expert_ffn_dim
            start = 0 if projection == "gate_proj" else width
            return params[f"{layer}.w13_weight"][index, start : start + width]
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return params[name][: self.args.vocab_size]
        module, projection, _ = name.rsplit(".", 2)
        if projection in _FUSED:
            start, stop = self.row_ranges[projection]
            return params[f"{module}.{_FUSED[projection]}.weight"][start:stop]
        return params[name]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each (Hugging Face name, tensor) into its place; the names loaded."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name == "lm_head.weight" and self.args.tie_embeddings:
                continue  # vLLM skips the head of a tied model
            target = self._target(name, params)
            if target.shape != tensor.shape or target.dtype != tensor.dtype:
                raise ValueError(
                    f"{name}: got {tensor.shape} {tensor.dtype}, the model holds {target.shape} {target.dtype}"
                )
            target.copy_(tensor)
            loaded.add(name)
        return loaded

    def hf_view(self, name: str) -> torch.Tensor:
        """Where Hugging Face tensor ``name`` sits in this model (a view), for tests to inspect."""
        return self._target(name, dict(self.named_parameters()))


@dataclass(frozen=True)
class StandInLogprob:
    """vLLM's ``Logprob``: the logprob of one token."""

    logprob: float


class StandInSamplingParams:
    """vLLM's ``SamplingParams``: records the keyword arguments it was given."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        for key, value in kwargs.items():
            setattr(self, key, value)


def standin_reload_weights(worker: Any, *args: Any, **kwargs: Any) -> None:
    """vLLM's ``Worker.reload_weights``: its arguments handed to the model runner's."""
    worker.model_runner.reload_weights(*args, **kwargs)


def plain_copy(value: Any) -> Any:
    """``value`` as vLLM's serializer would deliver it: tensors copied; anything but plain data refused."""
    if isinstance(value, torch.Tensor):
        assert value.device.type == "cpu", "collective_rpc carries CPU tensors"
        return value.clone()
    if isinstance(value, list | tuple):
        return type(value)(plain_copy(item) for item in value)
    if isinstance(value, dict):
        return {key: plain_copy(item) for key, item in value.items()}
    if isinstance(value, str | int | float | bool | bytes) or value is None:
        return value
    raise TypeError(f"collective_rpc was sent {type(value).__name__}, which is not plain data")


class StandInLLM:
    """vLLM's offline ``LLM``: records every call in ``calls``; one worker runs the extension methods."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.calls: list[tuple[Any, ...]] = [("LLM", {"model": model, **kwargs})]
        self.config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
        self.model = VLLMLayoutModel(self.config, getattr(torch, kwargs["dtype"]))
        module_name, class_name = kwargs["worker_extension_cls"].rsplit(".", 1)
        extension = getattr(importlib.import_module(module_name), class_name)
        self.worker = type("StandInWorker", (extension,), {"reload_weights": standin_reload_weights})()
        self.worker.model_runner = SimpleNamespace(model=self.model, reload_weights=self.model_reload_weights)
        self.started_from = {name: tensor.clone() for name, tensor in iter_hf_tensors(model)}
        """The tensors of the folder vLLM was started from (its loader reads them)."""
        self.model.load_weights(self.started_from.items())

    def model_reload_weights(self, weights_iterator: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """vLLM's model runner's ``reload_weights`` with the weights given: every weight through the loader."""
        assert weights_iterator is not None, "titanpod always sends the weights"
        self.model.load_weights(weights_iterator)

    def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        """Run ``method`` of the worker with copies of ``args`` and ``kwargs``; one result per worker."""
        assert isinstance(method, str), "methods are named, never sent as code"
        args, kwargs = plain_copy(tuple(args)), plain_copy(kwargs or {})
        self.calls.append(("collective_rpc", method, args, kwargs))
        return [getattr(self.worker, method)(*args, **kwargs)]

    def reset_prefix_cache(self) -> bool:
        """Record the call."""
        self.calls.append(("reset_prefix_cache",))
        return True

    def generate(self, prompts: list[dict], sampling_params: list[StandInSamplingParams], *, use_tqdm: bool = True):
        """Made-up completions: tokens and logprobs drawn from each request's seed; a stop token, if any, ends
        every other one early."""
        self.calls.append(("generate", prompts, sampling_params, {"use_tqdm": use_tqdm}))
        outputs = []
        for params in sampling_params:
            draw = random.Random(params.seed)
            tokens = [draw.randrange(self.model.args.vocab_size) for _ in range(params.max_tokens)]
            finish = "length"
            if params.stop_token_ids and params.seed % 2 == 0:
                tokens, finish = [*tokens[:1], params.stop_token_ids[0]], "stop"
            logprobs = [{token: StandInLogprob(-draw.random())} for token in tokens]
            choice = SimpleNamespace(token_ids=tokens, logprobs=logprobs, finish_reason=finish)
            outputs.append(SimpleNamespace(outputs=[choice]))
        return outputs

    def methods(self) -> list[str]:
        """The calls so far, by name (``collective_rpc`` calls by the method they ran)."""
        return [call[1] if call[0] == "collective_rpc" else call[0] for call in self.calls]


def standin_vllm() -> types.ModuleType:
    """A module with ``LLM``, ``SamplingParams`` and ``__version__``, to stand in for ``vllm``."""
    module = types.ModuleType("vllm")
    module.LLM = StandInLLM
    module.SamplingParams = StandInSamplingParams
    module.__version__ = "stand-in"
    return module
