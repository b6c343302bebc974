"""Opening and closing the rollout engine a ``RolloutConfig`` asks for: every engine is built here."""

from __future__ import annotations

from collections.abc import Callable

import torch

from titanpod.models import Transformer
from titanpod.recipes.posttrain.rollout_config import RolloutConfig
from titanpod.rl.rollout.builtin import BuiltinEngine
from titanpod.rl.rollout.ray_rollout import RayRollout
from titanpod.rl.rollout.streamed import sync_engine
from titanpod.rl.rollout.types import RolloutEngine
from titanpod.rl.rollout.vllm_engine import VLLMEngine


def open_rollout(
    config: RolloutConfig,
    model: Transformer,
    max_batch: int,
    say: Callable[[str], None],
    *,
    family: str,
    device: torch.device | None = None,
) -> RolloutEngine:
    """The rollout engine ``config`` asks for, holding ``model``'s weights as version 0: a ``BuiltinEngine`` on
    ``device`` (default: where ``model``'s embeddings are) in ``rollout.dtype``, filled by a streamed sync
    (``model`` may be sharded: every process must call this, and each gets its own engine), a ``RayRollout`` whose
    workers were checked to hold them in ``rollout.dtype``, or a ``VLLMEngine`` whose vLLM workers were (in
    ``rollout.vllm_dtype``; vLLM is given the model in the Hugging Face form ``family``'s spec states). Close it
    with ``close_rollout``."""
    if config.mode == "local":
        where = model.tok_embeddings.weight.device if device is None else device
        engine = BuiltinEngine.empty(model.args, getattr(torch, config.dtype), where, max_batch, ops=model.ops)
        sync_engine(model, engine, 0)
        return engine
    if config.mode == "vllm":
        engine = VLLMEngine(
            model,
            family,
            dtype=config.vllm_dtype,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            enforce_eager=config.vllm_enforce_eager,
            max_batch=max_batch,
            kv_cache_bytes=None if config.vllm_kv_cache_mib is None else config.vllm_kv_cache_mib * 2**20,
        )
        say(engine.describe())
        return engine
    rollout = RayRollout(
        model,
        config.workers,
        address=config.ray_address,
        worker_cpus=config.worker_cpus,
        worker_gpus=config.worker_gpus,
        max_batch=max_batch,
        say=say,
        dtype=getattr(torch, config.dtype),
    )
    say(rollout.describe())
    return rollout


def close_rollout(engine: RolloutEngine) -> None:
    """Stop ``engine``'s workers, if it has any (Ray actors, or vLLM's engine)."""
    if isinstance(engine, RayRollout | VLLMEngine):
        engine.close()
