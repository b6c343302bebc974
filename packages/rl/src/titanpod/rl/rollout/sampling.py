"""Choosing the next token: greedy, or temperature + top-p from per-completion seeded generators.

Legend: B rows (completions), V vocabulary.
"""

from __future__ import annotations

import hashlib

import torch


def completion_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The seed of one completion (a non-negative 63-bit int), from (seed, prompt, sample) alone."""
    key = hashlib.blake2b(f"{seed}/{prompt_index}/{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(key, "little") & ((1 << 63) - 1)


def completion_generator(seed: int, prompt_index: int, sample_index: int) -> torch.Generator:
    """A CPU generator for one completion, seeded by ``completion_seed``, never the global RNG."""
    return torch.Generator().manual_seed(completion_seed(seed, prompt_index, sample_index))


def top_p_filter(probs_BV: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities sorted high to low with those outside the nucleus zeroed, and the sort order.

    A token is kept when the mass strictly before it (in sorted order) is below ``top_p``,
    so the most likely token is always kept. Ties keep the lower token id first.
    """
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True, stable=True)
    if top_p < 1.0:
        mass_before_BV = sorted_BV.cumsum(dim=-1) - sorted_BV
        sorted_BV = sorted_BV.masked_fill(mass_before_BV >= top_p, 0.0)
    return sorted_BV, order_BV


def choose_tokens(
    logits_BV: torch.Tensor, temperature: float, top_p: float, generators: list[torch.Generator]
) -> torch.Tensor:
    """The next token of each row [B] (int64): argmax when ``temperature`` is 0, else one seeded draw per row.

    A draw takes one uniform number from the row's generator and inverts the cumulative
    distribution of the temperature-scaled, top-p-filtered probabilities (fp32).
    """
    if temperature == 0:
        return logits_BV.argmax(dim=-1)
    probs_BV = torch.softmax(logits_BV.float() / temperature, dim=-1)
    kept_BV, order_BV = top_p_filter(probs_BV, top_p)
    cdf_BV = kept_BV.cumsum(dim=-1)
    uniform_B = torch.stack([torch.rand((), generator=g) for g in generators]).to(cdf_BV.device)
    target_B1 = (uniform_B * cdf_BV[:, -1])[:, None]
    rank_B1 = torch.searchsorted(cdf_BV, target_B1, right=True).clamp_(max=cdf_BV.shape[-1] - 1)
    # A draw can land on a zeroed tail only through rounding at the very top: step back to a kept token.
    kept_count_B1 = (kept_BV > 0).sum(dim=-1, keepdim=True)
    rank_B1 = torch.minimum(rank_B1, kept_count_B1 - 1)
    return order_BV.gather(-1, rank_B1)[:, 0]


def sampled_logprobs(logits_BV: torch.Tensor, tokens_B: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 [B]: each row's token's logprob under softmax(logits / ``temperature``) over the whole vocabulary
    (the raw softmax when ``temperature`` is 0, i.e. greedy).

    Top-p does not renormalise it: it is the logprob the trainer computes from its own forward at the same
    temperature, so the two agree and the importance ratio of an update on fresh rollouts is 1.
    """
    scaled_BV = logits_BV.float() / temperature if temperature > 0 else logits_BV.float()
    return torch.log_softmax(scaled_BV, dim=-1).gather(-1, tokens_B[:, None])[:, 0]
