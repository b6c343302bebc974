"""What a rollout engine takes and gives: sampling parameters, completions, sync reports, the protocol."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions. The same params, seed and weights give the same completions."""

    max_new_tokens: int = 64
    """Most tokens generated per completion (the stop token, when hit, counts as one)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax, no randomness)."""
    top_p: float = 1.0
    """Nucleus sampling: draw from the smallest set of most likely tokens whose probability reaches
    ``top_p`` (the most likely token is always in it); 1 keeps the whole vocabulary."""
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end a completion (kept as its last token; ``finish_reason`` "stop")."""
    seed: int = 0
    """Seeds the draws; completion j of prompt i draws from its own generator seeded from
    (seed, i, j), so it does not depend on batching or on the other prompts."""
    n: int = 1
    """Completions per prompt (the GRPO group size)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.n < 1:
            problems.append(f"n (completions per prompt) must be >= 1, got {self.n}")
        if problems:
            raise ValueError("Bad SamplingParams: " + "; ".join(problems) + ".")


@dataclass
class Completion:
    """One sampled continuation of one prompt."""

    prompt_index: int
    """Index of the prompt in the list given to ``generate``."""
    prompt_ids: list[int]
    """The prompt's tokens."""
    token_ids: list[int]
    """Generated tokens; the stop token is the last one when ``finish_reason`` is "stop"."""
    logprobs: torch.Tensor
    """fp32 [len(token_ids)]: log-probability of each generated token under the model that sampled
    it, i.e. ``log_softmax`` of its raw logits (temperature 1, before top-p), as the trainer
    recomputes it."""
    finish_reason: FinishReason
    """"stop" if a stop token ended it, "length" if ``max_new_tokens`` did."""
    sample_index: int = 0
    """Which of the prompt's ``n`` completions this is (0 .. n-1)."""
    weights_version: int = 0
    """Version of the weights that generated it (for off-policy bookkeeping)."""


@dataclass(frozen=True)
class SyncReport:
    """The outcome of one weight sync into an engine."""

    version: int
    """The weights version the engine now holds."""
    checksum: str
    """``weights_checksum`` of the loaded weights (equal on trainer and engine)."""
    bytes: int
    """Bytes of tensor data copied."""
    seconds: float
    """Wall time of the copy and its verification."""
    extra: Mapping[str, object] = field(default_factory=dict)
    """Engine-specific notes (e.g. what was verified)."""


@runtime_checkable
class RolloutEngine(Protocol):
    """An inference engine that samples completions for post-training and takes new weights."""

    weights_version: int
    """Version of the weights it holds; ``load_weights`` only accepts newer ones."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """``len(prompts) * params.n`` completions, grouped by prompt: prompt 0's n, then prompt 1's, ..."""
        ...

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> SyncReport:
        """Copy ``state`` (titanpod parameter names) in, verify it, and take ``version``."""
        ...

    def checksum(self) -> str:
        """``weights_checksum`` of the weights the engine holds."""
        ...
