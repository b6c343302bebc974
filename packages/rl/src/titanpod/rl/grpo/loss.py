"""The GRPO objective as pure functions: group-relative advantages, the clipped policy loss, the k3 KL penalty.

Normalisation, the same for the loss and the KL term: a per-token mean over every masked (completion)
token of the batch, i.e. ``sum(term * mask) / sum(mask)``. A long completion therefore weighs more than
a short one, token for token (no per-sequence mean first). A batch with no completion token gives 0.

Legend: P prompts, n completions per prompt (the group), N sequences (P * n), T completion positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(rewards: torch.Tensor | Sequence[Sequence[float]], eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages [P, n]: ``(r - mean_group) / (std_group + eps)``, std over the group
    with no Bessel correction (population std).

    A group whose rewards are all equal (all right, or all wrong) gets zeros: its samples carry no
    learning signal (they still count in the token mean of the loss, with advantage 0). An empty
    group is a ``ValueError`` naming its prompt index; groups of different sizes are a ``ValueError``
    too (call once per group when samples were dropped).
    """
    if not isinstance(rewards, torch.Tensor):
        groups = [list(group) for group in rewards]
        for index, group in enumerate(groups):
            if not group:
                raise ValueError(f"Prompt {index} has an empty group: every prompt needs at least one reward.")
        sizes = {len(group) for group in groups}
        if len(sizes) > 1:
            raise ValueError(
                f"Groups have different sizes ({sorted(sizes)}): give a rectangular [P, n] batch, or call "
                "group_advantages once per group."
            )
        rewards = torch.tensor(groups, dtype=torch.float32) if groups else torch.zeros(0, 1)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, n] (prompts x completions), got shape {list(rewards.shape)}.")
    if rewards.shape[1] == 0 and rewards.shape[0] > 0:
        raise ValueError("Prompt 0 has an empty group: every prompt needs at least one reward.")
    rewards_Pn = rewards.float()
    mean_P1 = rewards_Pn.mean(dim=1, keepdim=True)
    std_P1 = rewards_Pn.std(dim=1, correction=0, keepdim=True)
    advantages_Pn = (rewards_Pn - mean_P1) / (std_P1 + eps)
    all_equal_P1 = (rewards_Pn == rewards_Pn[:, :1]).all(dim=1, keepdim=True)
    return torch.where(all_equal_P1, torch.zeros_like(advantages_Pn), advantages_Pn)


def masked_token_mean(values_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """``sum(values * mask) / sum(mask)`` over the whole batch (0 when the mask is empty)."""
    mask_NT = mask_NT.to(values_NT.dtype)
    return (values_NT * mask_NT).sum() / mask_NT.sum().clamp(min=1.0)


def _check_shapes(mask_NT: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor.shape != mask_NT.shape:
            raise ValueError(f"{name} has shape {list(tensor.shape)} but mask has {list(mask_NT.shape)}; give [N, T].")


def clipped_surrogate_terms(
    logprobs_new: torch.Tensor, logprobs_old: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token, the PPO clipped surrogate as a loss and whether clipping took effect; any matching shapes.

    ``ratio = exp(new - old)``; the loss term is ``-min(ratio * A, clip(ratio, 1-eps, 1+eps) * A)`` with the
    token's (its sequence's) advantage ``A``, broadcast against the logprobs. ``logprobs_old`` and the
    advantages are constants. Clipping took effect where the clipped term was strictly smaller (the token
    then gives no gradient): ``A > 0`` and ``ratio > 1 + eps``, or ``A < 0`` and ``ratio < 1 - eps``.
    """
    if clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0, got {clip_eps}.")
    ratio = torch.exp(logprobs_new - logprobs_old.detach())
    advantages = advantages.detach().to(ratio.dtype)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def k3_kl_terms(logprobs_new: torch.Tensor, logprobs_ref: torch.Tensor) -> torch.Tensor:
    """Per token, KL(new || ref) by the k3 estimator ``exp(ref - new) - (ref - new) - 1`` (never negative,
    0 where the logprobs agree); ``logprobs_ref`` is a constant."""
    delta = logprobs_ref.detach() - logprobs_new
    return torch.exp(delta) - delta - 1.0


def clipped_policy_loss(
    logprobs_new: torch.Tensor,
    logprobs_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PPO clipped surrogate as a loss, and the clip fraction.

    The per-token terms are ``clipped_surrogate_terms``'; the loss is their mean over the masked tokens of
    the whole batch (see the module docstring), the clip fraction the share of masked tokens where clipping
    took effect.

    Shapes: ``logprobs_new``, ``logprobs_old``, ``mask`` [N, T]; ``advantages`` [N].
    """
    _check_shapes(mask, logprobs_new=logprobs_new, logprobs_old=logprobs_old)
    if advantages.shape != mask.shape[:1]:
        raise ValueError(f"advantages has shape {list(advantages.shape)}; give one per sequence: [{mask.shape[0]}].")
    terms_NT, took_clip_NT = clipped_surrogate_terms(logprobs_new, logprobs_old, advantages[:, None], clip_eps)
    loss = masked_token_mean(terms_NT, mask)
    with torch.no_grad():
        clip_fraction = masked_token_mean(took_clip_NT.to(terms_NT.dtype), mask)
    return loss, clip_fraction


def kl_penalty(logprobs_new: torch.Tensor, logprobs_ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(new || ref) by the k3 estimator (``k3_kl_terms``), averaged over masked tokens like the loss.

    With a KL coefficient (beta) of 0 the run skips this and the reference model altogether.
    """
    _check_shapes(mask, logprobs_new=logprobs_new, logprobs_ref=logprobs_ref)
    return masked_token_mean(k3_kl_terms(logprobs_new, logprobs_ref), mask)
