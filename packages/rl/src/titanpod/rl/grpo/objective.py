"""The GRPO objective as a model the graph's training step runs: ``loss`` / ``loss_and_metrics`` of a batch.

Legend: N sequences (prompt + completion, right-padded), L positions, F target fields, V vocabulary.

A GRPO batch is the graph's two-tensor batch ``(tokens_NL, targets_NLF)``, so every step mode
(eager, per_block, whole_step) takes it unchanged:

- ``tokens_NL``: prompt and completion tokens of each sequence, right-padded to a fixed length.
- ``targets_NLF`` (fp32): what the objective knows about token ``t`` of each sequence, field by
  field (``TARGET_FIELDS``): its weight in the loss (0 for prompt tokens, padding and samples
  left out; see ``titanpod.rl.grpo.batches`` for how weights normalise the loss over the whole
  step), its sequence's advantage, its logprob under the weights that sampled it, and its
  logprob under the reference model (read only when ``kl_beta`` > 0).

Every logprob is of softmax(logits / temperature) at the rollouts' sampling temperature, over the whole
vocabulary: the distribution the completions were drawn from, before top-p cut its tail (as TRL's GRPO
trainer and VeRL's actor compute them). The importance ratio is then 1 at the first update of a step and the
gradient is that of the sampled policy.

The loss is ``sum(weight x (surrogate + kl_beta x k3 KL))`` over every token, with the
per-token terms of ``titanpod.rl.grpo.loss``. Beside it the objective reports ``clip_fraction``
and (with a KL term) ``kl`` as the same weighted sums, so they too add up over micro-batches
and data ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from titanpod.models import Transformer
from titanpod.rl.grpo.loss import clipped_surrogate_terms, k3_kl_terms

TARGET_FIELDS = ("weight", "advantage", "old_logprob", "reference_logprob")
"""The fields of ``targets_NLF``'s last dimension, in order."""
WEIGHT, ADVANTAGE, OLD_LOGPROB, REFERENCE_LOGPROB = range(len(TARGET_FIELDS))
"""Each field's index in ``targets_NLF``'s last dimension."""
CLIP_FRACTION, KL = "clip_fraction", "kl"
"""The names of the figures the objective reports beside its loss."""


def token_logprobs(policy: Transformer, tokens_NL: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """fp32 [N, L]: the logprob of each token given the tokens before it (one causal forward) under
    softmax(logits / ``temperature``) over the whole vocabulary; 0 at position 0, which has nothing before it.
    Right padding changes no earlier position."""
    if temperature <= 0:
        raise ValueError(f"token_logprobs needs a temperature > 0, got {temperature}.")
    logits_NLV = policy(tokens_NL)[:, :-1].float() / temperature
    targets_NL = tokens_NL[:, 1:]
    logprobs_NL = logits_NLV.gather(-1, targets_NL[:, :, None])[:, :, 0] - logits_NLV.logsumexp(dim=-1)
    return torch.nn.functional.pad(logprobs_NL, (1, 0))


class GRPOObjective(nn.Module):
    """The policy under the clipped group-relative objective (+ ``kl_beta`` x the k3 KL to a reference).

    Its parameters are the policy's, in the policy's order, so a training step over the objective
    updates the policy and a checkpoint of the policy holds the step's optimizer state in order.
    """

    def __init__(self, policy: Transformer, clip_eps: float, kl_beta: float, temperature: float = 1.0) -> None:
        """Wrap ``policy``; ``clip_eps`` is the PPO clip range of the ratio, ``kl_beta`` the KL weight (0: none),
        ``temperature`` the rollouts' sampling temperature: the policy trained is softmax(logits / temperature),
        the distribution the completions were drawn from."""
        super().__init__()
        if clip_eps < 0 or kl_beta < 0:
            raise ValueError(f"clip_eps and kl_beta must be >= 0, got {clip_eps} and {kl_beta}.")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        self.policy = policy
        self.clip_eps = clip_eps
        self.kl_beta = kl_beta
        self.temperature = temperature

    @property
    def layers(self) -> nn.ModuleList:
        """The policy's transformer blocks (what a per-block step compiles)."""
        return self.policy.layers

    def loss_and_metrics(
        self, tokens_NL: torch.Tensor, targets_NLF: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The weighted GRPO loss of a batch, and its weighted ``clip_fraction`` (and ``kl``), each 0-d."""
        expected = (*tokens_NL.shape, len(TARGET_FIELDS))
        if tuple(targets_NLF.shape) != expected:
            raise ValueError(
                f"targets_NLF has shape {list(targets_NLF.shape)}; a GRPO batch of tokens {list(tokens_NL.shape)} "
                f"needs {list(expected)} (fields {', '.join(TARGET_FIELDS)}): build it with GRPOBatch.step_batch()."
            )
        targets_NLF = targets_NLF.float()
        weight_NL = targets_NLF[..., WEIGHT]
        new_NL = token_logprobs(self.policy, tokens_NL, self.temperature)
        surrogate_NL, took_clip_NL = clipped_surrogate_terms(
            new_NL, targets_NLF[..., OLD_LOGPROB], targets_NLF[..., ADVANTAGE], self.clip_eps
        )
        loss = (surrogate_NL * weight_NL).sum()
        metrics = {CLIP_FRACTION: (took_clip_NL.float() * weight_NL).sum().detach()}
        if self.kl_beta > 0:
            kl = (k3_kl_terms(new_NL, targets_NLF[..., REFERENCE_LOGPROB]) * weight_NL).sum()
            loss = loss + self.kl_beta * kl
            metrics[KL] = kl.detach()
        return loss, metrics

    def loss(self, tokens_NL: torch.Tensor, targets_NLF: torch.Tensor) -> torch.Tensor:
        """The weighted GRPO loss of a batch (see ``loss_and_metrics``)."""
        return self.loss_and_metrics(tokens_NL, targets_NLF)[0]
