"""Rollouts for post-training (GRPO): sample completions with an inference engine, sync weights into it.

``BuiltinEngine`` runs titanpod's own ``Transformer`` with its KV cache (any lane PyTorch
runs on); ``RayRollout`` runs BuiltinEngines in Ray actors; ``VLLMEngine`` adapts vLLM's offline
API (the ``[vllm]`` extra, a CUDA GPU). All follow ``RolloutEngine``; ``engines.open_rollout`` builds
the one a ``RolloutConfig`` asks for. ``sync_weights`` copies a trainer's weights into an engine, which
verifies them by checksum and refuses stale versions; ``streamed.sync_engine`` streams a (sharded) trainer's
weights in the engine's dtype, one gathered tensor at a time.
"""

from titanpod.rl.rollout.builtin import BuiltinEngine, validate_prompts
from titanpod.rl.rollout.sampling import choose_tokens, completion_generator, top_p_filter
from titanpod.rl.rollout.sync import check_state_matches, sync_weights, trainer_state, weights_checksum
from titanpod.rl.rollout.types import Completion, RolloutEngine, SamplingParams, SyncReport
from titanpod.rl.rollout.vllm_engine import VLLM_MISSING, VLLMEngine

__all__ = [
    "VLLM_MISSING",
    "BuiltinEngine",
    "Completion",
    "RolloutEngine",
    "SamplingParams",
    "SyncReport",
    "VLLMEngine",
    "check_state_matches",
    "choose_tokens",
    "completion_generator",
    "sync_weights",
    "top_p_filter",
    "trainer_state",
    "validate_prompts",
    "weights_checksum",
]
