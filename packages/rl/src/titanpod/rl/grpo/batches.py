"""A step's scored rollouts as the batch the GRPO objective trains on (see ``titanpod.rl.grpo.objective``).

Legend: N sequences, L positions (the run's fixed sequence length), F target fields, A micro-batches,
D data-parallel ranks.

Every sequence of the rank's share is a row, also those whose reward failed (their weights are
0), so a step's batch has the same shape every step. The loss is a mean over every kept
completion token of the whole step, on every rank and in every micro-batch together. A training
step averages its micro-batches' losses, and sharded gradients are averaged over the data ranks,
so each kept token weighs ``A x D / T`` (T: kept completion tokens of the whole step, all ranks):
the gradient is then exactly that of the step-wide token mean, however the step is split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from titanpod.rl.grpo.objective import ADVANTAGE, OLD_LOGPROB, REFERENCE_LOGPROB, TARGET_FIELDS, WEIGHT
from titanpod.rl.grpo.rewards import ScoredRollouts


@dataclass(frozen=True)
class GRPOBatch:
    """One data rank's training sequences of a step and what the objective knows of each token."""

    tokens_NL: torch.Tensor
    """Prompt + completion tokens, right-padded to the run's sequence length (int64)."""
    targets_NLF: torch.Tensor
    """Per token, the fields ``TARGET_FIELDS`` (fp32)."""

    def to(self, device: torch.device) -> GRPOBatch:
        """The batch on ``device``."""
        return GRPOBatch(self.tokens_NL.to(device), self.targets_NLF.to(device))

    @staticmethod
    def check_split(rows: int, count: int) -> None:
        """``ValueError`` unless ``rows`` sequences split into ``count`` equal micro-batches."""
        if count < 1 or rows % count:
            raise ValueError(
                f"A data rank's {rows} sequences (its prompts x grpo.group_size) do not split into "
                f"train.grad_accum_steps={count} equal micro-batches: choose a divisor of {rows}."
            )

    def micro_batches(self, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The rows in ``count`` equal, contiguous micro-batches, each the graph step's ``(tokens, targets)``."""
        rows = self.tokens_NL.shape[0]
        self.check_split(rows, count)
        size = rows // count
        return [
            (self.tokens_NL[i * size : (i + 1) * size], self.targets_NLF[i * size : (i + 1) * size])
            for i in range(count)
        ]


def token_weight(step_tokens: int, micro_batches: int, data_ranks: int) -> float:
    """The weight of each kept completion token: ``A x D / T`` (see the module docstring); 0 when ``T`` is 0."""
    return micro_batches * data_ranks / step_tokens if step_tokens else 0.0


def build_batch(
    scored: ScoredRollouts,
    sequence_length: int,
    pad_id: int,
    weight: float,
    reference_logprobs: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> GRPOBatch:
    """The batch of ``scored``'s rollouts: every sequence padded to ``sequence_length`` with ``pad_id``; each kept
    completion token weighted ``weight``, with its sequence's advantage and its sampling logprob.

    ``reference_logprobs(tokens_NL) -> [N, L]`` (the reference model's ``token_logprobs``) fills the reference
    field when given; without it the field is 0.
    """
    rows = len(scored.completions)
    tokens_NL = torch.full((rows, sequence_length), pad_id, dtype=torch.long)
    targets_NLF = torch.zeros(rows, sequence_length, len(TARGET_FIELDS))
    for row, (completion, kept, advantage) in enumerate(
        zip(scored.completions, scored.kept, scored.advantages, strict=True)
    ):
        sequence = completion.prompt_ids + completion.token_ids
        if len(sequence) > sequence_length:
            raise ValueError(
                f"A sequence of {len(sequence)} tokens (prompt {len(completion.prompt_ids)} + completion "
                f"{len(completion.token_ids)}) is longer than the run's sequence length {sequence_length}."
            )
        tokens_NL[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        if not kept or not completion.token_ids:
            continue
        start, stop = len(completion.prompt_ids), len(sequence)
        targets_NLF[row, start:stop, WEIGHT] = weight
        targets_NLF[row, start:stop, ADVANTAGE] = advantage
        targets_NLF[row, start:stop, OLD_LOGPROB] = torch.as_tensor(completion.logprobs, dtype=torch.float32)
    if reference_logprobs is not None:
        with torch.no_grad():
            targets_NLF[..., REFERENCE_LOGPROB] = reference_logprobs(tokens_NL).float().cpu()
    return GRPOBatch(tokens_NL, targets_NLF)


def with_policy_logprobs(batch: GRPOBatch, policy_logprobs: Callable[[torch.Tensor], torch.Tensor]) -> GRPOBatch:
    """``batch`` with the sampling logprob of every weighted token replaced by ``policy_logprobs(tokens_NL)``
    (the policy's ``token_logprobs`` at the rollout temperature, before any update of the step).

    For an engine whose recorded logprobs are not those of the distribution it sampled from (vLLM's raw
    logprobs are at temperature 1): the ratio of the step's first update is then 1, as with the built-in engine.
    """
    targets_NLF = batch.targets_NLF.clone()
    with torch.no_grad():
        fresh_NL = policy_logprobs(batch.tokens_NL).float().cpu()
    weighted_NL = targets_NLF[..., WEIGHT] > 0
    targets_NLF[..., OLD_LOGPROB] = torch.where(weighted_NL, fresh_NL, targets_NLF[..., OLD_LOGPROB])
    return GRPOBatch(batch.tokens_NL, targets_NLF)
