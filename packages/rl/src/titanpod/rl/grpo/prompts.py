"""The prompts of every GRPO step, drawn and checked before any work, and the run's position among them.

Each step's prompts and its sampling seed depend only on ``train.seed`` and the step number, so
a run resumed at step k draws and samples what the uninterrupted run drew and sampled there.
A data rank takes a contiguous block of the step's prompt groups; the engine's seeds count from
each prompt's index in the whole step, so the split does not change any completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from titanpod.data.sft.records import prompt_text
from titanpod.data.sft.tokenizer import SFTTokenizer
from titanpod.data.tasks import Example, Task

SEED_STRIDE = 100_003
"""Step ``s`` of a run seeded ``seed`` draws its prompts and samples with ``seed * SEED_STRIDE + s``."""


def step_seed(seed: int, step_number: int) -> int:
    """The seed of GRPO step ``step_number`` (1-based): its prompts and its sampling."""
    return seed * SEED_STRIDE + step_number


def check_prompt_fits(prompt: str, ids: list[int], max_new_tokens: int, max_seq_len: int, where: str) -> None:
    """``ValueError`` when a prompt plus its longest completion does not fit the model's context."""
    if len(ids) + max_new_tokens > max_seq_len:
        raise ValueError(
            f"The prompt {prompt!r} ({where}) has {len(ids)} tokens; with grpo.max_new_tokens {max_new_tokens} "
            f"it needs {len(ids) + max_new_tokens} positions, more than the model's context of {max_seq_len}. "
            "Lower --grpo.max-new-tokens or use shorter prompts."
        )


@dataclass(frozen=True)
class StepPrompts:
    """One GRPO step's prompts."""

    examples: list[Example]
    """The task's examples (prompt and answer), in order."""
    prompt_ids: list[list[int]]
    """Each prompt's tokens, as laid out for the model."""


@dataclass(frozen=True)
class PromptShare:
    """The block of each step's prompts one data rank samples and trains on."""

    start: int
    """Index of the block's first prompt in the step."""
    stop: int
    """One past the block's last prompt."""


def prompt_share(prompts_per_step: int, data_rank: int, data_world: int) -> PromptShare:
    """Data rank ``data_rank``'s block of ``prompts_per_step`` prompts; ``ValueError`` when they do not split evenly."""
    if prompts_per_step % data_world:
        raise ValueError(
            f"grpo.prompts_per_step {prompts_per_step} does not split evenly over {data_world} data-parallel ranks: "
            f"choose a multiple of {data_world}."
        )
    size = prompts_per_step // data_world
    return PromptShare(data_rank * size, (data_rank + 1) * size)


class PromptPlan:
    """Every step's prompts (drawn up front, each checked to fit the context) and how many steps are done.

    Its position (``state_dict``) is what a GRPO checkpoint saves as the data position: the steps
    done and the seed the prompts and samples were drawn with.
    """

    def __init__(
        self,
        task: Task,
        tokenizer: SFTTokenizer,
        *,
        steps: int,
        prompts_per_step: int,
        seed: int,
        prompt_format: str,
        max_new_tokens: int,
        max_seq_len: int,
    ) -> None:
        """Draw ``prompts_per_step`` train prompts of ``task`` for each of ``steps`` steps with ``seed``, lay them
        out in ``prompt_format`` and check each fits ``max_seq_len`` with ``max_new_tokens`` generated."""
        self.seed = seed
        """The run's seed (``train.seed``)."""
        self.max_new_tokens = max_new_tokens
        """The longest completion sampled."""
        self.steps: list[StepPrompts] = []
        """Every step's prompts; step ``s`` (1-based) is ``steps[s - 1]``."""
        for step_number in range(1, steps + 1):
            examples = task.examples("train", prompts_per_step, step_seed(seed, step_number))
            ids = tokenizer.encode_batch([prompt_text(tokenizer, e.prompt, prompt_format) for e in examples])
            for example, prompt_ids in zip(examples, ids, strict=True):
                check_prompt_fits(example.prompt, prompt_ids, max_new_tokens, max_seq_len, f"step {step_number}")
            self.steps.append(StepPrompts(examples, ids))
        self.steps_done = 0
        """GRPO steps completed (the next step is ``steps_done + 1``)."""

    @property
    def sequence_length(self) -> int:
        """Positions of every training sequence of the run: its longest prompt plus the longest completion, so
        every step's batch has one shape (a captured whole step is reused, not captured again)."""
        longest = max(len(ids) for step in self.steps for ids in step.prompt_ids)
        return longest + self.max_new_tokens

    def prompts(self, step_number: int) -> StepPrompts:
        """The prompts of step ``step_number`` (1-based)."""
        return self.steps[step_number - 1]

    def sampling_seed(self, step_number: int) -> int:
        """The sampling seed of step ``step_number``."""
        return step_seed(self.seed, step_number)

    def state_dict(self) -> dict[str, Any]:
        """The position: steps done and the seed they were drawn with."""
        return {"grpo_steps_done": self.steps_done, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after ``state``'s steps; ``ValueError`` when it was drawn with another seed."""
        if state.get("seed") != self.seed:
            raise ValueError(
                f"The checkpoint's prompts and samples were drawn with train.seed {state.get('seed')}, this run "
                f"has {self.seed}: resume with --train.seed {state.get('seed')}, or start fresh with "
                "--checkpoint.resume never."
            )
        done = int(state["grpo_steps_done"])
        if done > len(self.steps):
            raise ValueError(
                f"The checkpoint has {done} GRPO steps done, more than this run's train.steps {len(self.steps)}: "
                f"raise --train.steps to at least {done}."
            )
        self.steps_done = done
