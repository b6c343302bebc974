"""Scoring a step's completions and turning rewards into group-relative advantages.

A reward that raises (or returns a non-number, or one that is not finite) is logged and its sample left out
of the update and counted, never scored 0. A prompt's group is the rewards of its samples that were scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from titanpod.data.tasks import Example
from titanpod.rl.grpo.loss import group_advantages
from titanpod.rl.grpo.reward_import import RowReward, reward_number
from titanpod.rl.rollout import Completion

Reward = Callable[[str, str, str], float]
"""A reward function: (prompt, completion text, answer) -> reward."""
AnyReward = Reward | RowReward
"""What scores a completion: a ``Reward``, or a user's ``RowReward`` that also reads the prompt's row."""


def reward_of(score_fn: AnyReward, example: Example, completion: str) -> float:
    """``score_fn``'s value on ``example`` and ``completion``; ``TypeError`` when it is not a number."""
    if isinstance(score_fn, RowReward):
        return score_fn.score(example, completion)
    return reward_number(score_fn(example.prompt, completion, example.answer), "")


def reward_name(score_fn: AnyReward) -> str:
    """``score_fn`` as messages name it: a user's import path, else the function's own name."""
    if isinstance(score_fn, RowReward):
        return score_fn.name
    return getattr(score_fn, "__qualname__", None) or type(score_fn).__name__


@dataclass(frozen=True)
class ScoredRollouts:
    """A step's completions (this data rank's share) with their rewards and advantages."""

    completions: list[Completion]
    """The completions, grouped by prompt."""
    rewards: list[float | None]
    """Each completion's reward; ``None`` when the reward function failed on it (left out)."""
    advantages: list[float]
    """Each completion's group-relative advantage (0 for those left out)."""
    errors: list[str]
    """A message for each completion whose reward failed."""
    zero_signal_groups: int
    """Prompts whose scored samples all earned the same reward (no learning signal)."""

    @property
    def kept(self) -> list[bool]:
        """Whether each completion takes part in the update (its reward was scored)."""
        return [reward is not None for reward in self.rewards]

    @property
    def completion_tokens(self) -> int:
        """Completion tokens of the kept samples: how many tokens the loss averages over."""
        return sum(len(c.token_ids) for c, r in zip(self.completions, self.rewards, strict=True) if r is not None)


def score_completions(
    examples: list[Example], completions: list[Completion], texts: list[str], score_fn: AnyReward, first_prompt: int = 0
) -> tuple[list[float | None], list[str]]:
    """Each completion's reward, or ``None`` when the reward function raised or returned a non-finite value;
    and a message for each such failure, saying which of the two (the sample is skipped, never scored 0).

    ``examples`` are the whole step's; a completion's ``prompt_index`` minus ``first_prompt`` is its example.
    """
    rewards: list[float | None] = []
    errors: list[str] = []
    name = reward_name(score_fn)
    for completion, text in zip(completions, texts, strict=True):
        example = examples[completion.prompt_index - first_prompt]
        try:
            value = reward_of(score_fn, example, text)
        except Exception as error:  # any failure of the reward code skips the sample, and says so
            rewards.append(None)
            errors.append(
                f"the reward function {name} raised on prompt {example.prompt!r}, completion {text!r}: "
                f"{type(error).__name__}: {error}"
            )
            continue
        if not math.isfinite(value):  # returned, not raised: say what it returned
            rewards.append(None)
            errors.append(
                f"the reward function {name} returned {value} (not a finite number) on prompt {example.prompt!r}, "
                f"completion {text!r}"
            )
            continue
        rewards.append(value)
    return rewards, errors


def score_rollouts(
    examples: list[Example],
    completions: list[Completion],
    texts: list[str],
    score_fn: AnyReward,
    first_prompt: int = 0,
) -> ScoredRollouts:
    """Score ``completions`` (decoded as ``texts``) and give each kept one its advantage within its prompt's group.

    ``examples`` and ``first_prompt`` as in ``score_completions``.
    """
    rewards, errors = score_completions(examples, completions, texts, score_fn, first_prompt)
    advantages = [0.0] * len(completions)
    groups: dict[int, list[int]] = {}
    for row, (completion, reward) in enumerate(zip(completions, rewards, strict=True)):
        if reward is not None:
            groups.setdefault(completion.prompt_index, []).append(row)
    zero_signal = 0
    for rows in groups.values():
        group_rewards = [rewards[row] for row in rows]
        for row, advantage in zip(rows, group_advantages([group_rewards])[0].tolist(), strict=True):
            advantages[row] = advantage
        zero_signal += len(set(group_rewards)) == 1
    return ScoredRollouts(completions, rewards, advantages, errors, zero_signal)
