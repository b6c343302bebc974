"""Scoring a step's completions and turning rewards into group-relative advantages.

Each call of the reward function runs with a time limit (``titanpod.rl.grpo.reward_call``). A reward that raises
(or returns a non-number) is logged and its sample left out of the update and counted, never scored 0, so a
passing fault of a remote judge does not end a long run. A reward the run cannot go on after (a call past its
time limit, a ``sys.exit``, NaN, infinity, or a number beyond ``REWARD_LIMIT``) stops the step with a
``RewardStop`` naming the sample. A prompt's group is the rewards of its samples that were scored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from titanpod.data.tasks import Example
from titanpod.rl.grpo.loss import group_advantages
from titanpod.rl.grpo.reward_call import RewardExit, RewardStop, RewardTimeout, call_with_timeout, failure_message
from titanpod.rl.grpo.reward_import import RowReward, reward_number, unusable_reward_message, usable_reward
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
    stop: str | None = None
    """Why the step cannot be trained on (a ``RewardStop``'s message); ``None`` when it can."""

    @property
    def kept(self) -> list[bool]:
        """Whether each completion takes part in the update (its reward was scored)."""
        return [reward is not None for reward in self.rewards]

    @property
    def completion_tokens(self) -> int:
        """Completion tokens of the kept samples: how many tokens the loss averages over."""
        return sum(len(c.token_ids) for c, r in zip(self.completions, self.rewards, strict=True) if r is not None)


def short(text: str, size: int = 40) -> str:
    """``text`` for a one-line message: quoted, cut to ``size`` characters with an ellipsis."""
    return repr(text if len(text) <= size else text[:size] + "…")


def sample_place(completion: Completion, prompt: str, text: str) -> str:
    """Where a sample is, for messages: its prompt's index in the step, its index among the prompt's completions,
    and the start of each text."""
    return (
        f"on prompt {completion.prompt_index}, completion {completion.sample_index} of the step (prompt "
        f"{short(prompt)}, completion {short(text)})"
    )


def score_completions(
    examples: list[Example],
    completions: list[Completion],
    texts: list[str],
    score_fn: AnyReward,
    first_prompt: int = 0,
    *,
    timeout_s: float | None = None,
) -> tuple[list[float | None], list[str]]:
    """Each completion's reward, or ``None`` when the reward function raised; and a message for each such
    sample (it is skipped, never scored 0).

    ``RewardStop``, naming the sample and the fix, when a call took longer than ``timeout_s`` seconds (``None``:
    no limit), called ``sys.exit``, or returned NaN, infinity or a number beyond ``REWARD_LIMIT``. ``examples``
    are the whole step's; a completion's ``prompt_index`` minus ``first_prompt`` is its example.
    """
    rewards: list[float | None] = []
    errors: list[str] = []
    name = reward_name(score_fn)
    for completion, text in zip(completions, texts, strict=True):
        example = examples[completion.prompt_index - first_prompt]
        try:
            value = call_with_timeout(partial(reward_of, score_fn, example, text), timeout_s, name)
        except (RewardTimeout, RewardExit) as error:
            raise RewardStop(failure_message(error, name, sample_place(completion, example.prompt, text))) from error
        except Exception as error:  # any other failure of the reward code skips the sample, and says so
            rewards.append(None)
            errors.append(
                f"the reward function {name} raised on prompt {example.prompt!r}, completion {text!r}: "
                f"{type(error).__name__}: {error}"
            )
            continue
        if not usable_reward(value):
            raise RewardStop(unusable_reward_message(value, name, sample_place(completion, example.prompt, text)))
        rewards.append(value)
    return rewards, errors


def score_rollouts(
    examples: list[Example],
    completions: list[Completion],
    texts: list[str],
    score_fn: AnyReward,
    first_prompt: int = 0,
    *,
    timeout_s: float | None = None,
) -> ScoredRollouts:
    """Score ``completions`` (decoded as ``texts``) and give each kept one its advantage within its prompt's group;
    after a ``RewardStop`` nothing is kept and ``stop`` says why.

    ``examples``, ``first_prompt`` and ``timeout_s`` as in ``score_completions``.
    """
    try:
        rewards, errors = score_completions(examples, completions, texts, score_fn, first_prompt, timeout_s=timeout_s)
    except RewardStop as stop:  # the caller stops every process of the run on it, before any update
        return ScoredRollouts(completions, [None] * len(completions), [0.0] * len(completions), [], 0, str(stop))
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
