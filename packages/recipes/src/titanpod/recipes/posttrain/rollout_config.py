"""Where a GRPO run samples its rollouts (``rollout.*``): this process, Ray workers, or a vLLM engine."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, get_args

from titanpod.data.sft.config import choice

RolloutMode = Literal["local", "ray", "vllm"]
"""Where rollouts run (``rollout.mode``)."""
VllmDtype = Literal["bfloat16", "float16", "float32"]
"""The dtypes a vLLM rollout engine may hold its weights in (``rollout.vllm_dtype``)."""
RolloutDtype = Literal["float32", "bfloat16", "float16"]
"""The dtypes a built-in rollout engine may hold its weights in (``rollout.dtype``)."""
ROLLOUT_DTYPES: tuple[str, ...] = get_args(RolloutDtype)
"""The dtypes a built-in rollout engine may hold its weights in (``rollout.dtype``)."""
ROLLOUT_MODES: tuple[str, ...] = get_args(RolloutMode)
"""Where rollouts run (``rollout.mode``)."""
VLLM_DTYPES: tuple[str, ...] = get_args(VllmDtype)
"""The dtypes a vLLM rollout engine may hold its weights in (``rollout.vllm_dtype``)."""


@dataclass(frozen=True)
class RolloutConfig:
    """Where the rollouts are sampled: in the trainer's process, by rollout workers on Ray, or by vLLM."""

    mode: RolloutMode = "local"
    """``local``: a ``BuiltinEngine`` in the trainer's process (the default). ``ray``: ``workers`` Ray actors,
    each a ``BuiltinEngine`` in its own process; the trainer syncs its weights to all of them every step.
    ``vllm``: one vLLM engine started by the trainer's process (``titanpod-rl[vllm]`` on a CUDA GPU, or the
    environment in envs/vllm with vLLM's CPU build);
    the trainer syncs its weights into vLLM's workers every step, and each one checks them by checksum."""
    workers: int = 1
    """Rollout workers (``ray`` mode); a step's prompts are split evenly between them."""
    ray_address: str | None = None
    """The Ray cluster to join (``ray`` mode): ``None`` joins the one ``RAY_ADDRESS`` names or else starts a
    local cluster for the run (shut down at its end); ``auto`` or ``host:port`` joins a running one."""
    worker_cpus: float = 1.0
    """CPUs each Ray worker reserves."""
    worker_gpus: float = 0.0
    """GPUs each Ray worker reserves; above 0 the worker decodes on cuda."""
    dtype: RolloutDtype = "float32"
    """The inference dtype of the built-in engine (``local`` and ``ray`` modes): it holds its weights and its KV
    cache in it, and every sync gathers and sends the weights in it (``float32``, the default, samples with the
    trainer's own fp32 values; ``bfloat16`` halves the engine's memory and each sync's traffic). The checksum each
    sync checks is of the weights in this dtype. ``vllm`` mode takes ``vllm_dtype`` instead."""
    vllm_dtype: VllmDtype = "bfloat16"
    """The dtype vLLM holds the weights in (``vllm`` mode): ``bfloat16``, ``float16`` or ``float32``. The rollout
    logprobs come from these weights; ``float32`` matches the trainer's fp32 logprobs most closely."""
    vllm_gpu_memory_utilization: float = 0.5
    """The share of the GPU's memory vLLM may take for weights, activations and KV cache (``vllm`` mode), in
    (0, 1]; leave room for the trainer when it shares the GPU."""
    vllm_enforce_eager: bool = False
    """Run vLLM's model eagerly, without capturing CUDA graphs or compiling (``vllm`` mode): slower decoding,
    faster start. On vLLM's CPU build (envs/vllm) it saves most of the start."""
    vllm_kv_cache_mib: int | None = None
    """The KV cache's size in MiB (``vllm`` mode); ``None`` lets vLLM size it: on a GPU from
    ``vllm_gpu_memory_utilization``, on its CPU build from ``VLLM_CPU_KVCACHE_SPACE`` or the free memory after a
    warm-up pass. Set it on a CPU machine shared with the trainer (a few MiB hold a small model's rollouts)."""

    @property
    def inference_dtype(self) -> str:
        """The dtype the engine holds its weights and KV cache in: ``vllm_dtype`` in ``vllm`` mode, else ``dtype``."""
        return self.vllm_dtype if self.mode == "vllm" else self.dtype

    def __post_init__(self) -> None:
        choice("rollout.mode", self.mode, ROLLOUT_MODES)
        choice("rollout.vllm_dtype", self.vllm_dtype, VLLM_DTYPES)
        choice("rollout.dtype", self.dtype, ROLLOUT_DTYPES)
        if self.mode == "vllm" and self.dtype != "float32":
            raise ValueError(
                f"rollout.dtype {self.dtype!r} applies to the built-in engine; a vLLM engine holds its weights in "
                "rollout.vllm_dtype: set --rollout.vllm-dtype instead."
            )
        if self.workers < 1 or self.worker_cpus < 0 or self.worker_gpus < 0:
            raise ValueError(
                f"rollout: workers must be >= 1 and worker_cpus, worker_gpus >= 0; got {self.workers}, "
                f"{self.worker_cpus}, {self.worker_gpus}."
            )
        if self.mode != "ray" and self.workers != 1:
            raise ValueError(
                f"rollout.workers is {self.workers}, but rollout.mode is {self.mode!r} (one engine): set "
                "--rollout.mode ray for several workers."
            )
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(
                f"rollout.vllm_gpu_memory_utilization must lie in (0, 1], got {self.vllm_gpu_memory_utilization}."
            )
        if self.vllm_kv_cache_mib is not None and self.vllm_kv_cache_mib < 1:
            raise ValueError(f"rollout.vllm_kv_cache_mib must be at least 1 (MiB), got {self.vllm_kv_cache_mib}.")
        changed = [f.name for f in fields(self) if f.name.startswith("vllm_") and getattr(self, f.name) != f.default]
        if self.mode != "vllm" and changed:
            raise ValueError(
                f"rollout.{changed[0]} applies to rollout.mode 'vllm', but rollout.mode is {self.mode!r}: "
                "add --rollout.mode vllm, or leave it out."
            )
