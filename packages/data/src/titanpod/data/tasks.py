"""Built-in post-training tasks: prompts the project generates itself, each with a verifiable answer.

A task makes examples (a prompt and its one right answer) for a ``train`` or a ``test`` split, and
scores a model's completion against the answer: the reward is 1.0 when the completion, cut at the
end-of-text marker and stripped of surrounding whitespace, is exactly the answer, else 0.0 (no
partial credit, so a reward is also a correctness bit). The two splits never share a prompt: an
example's split is fixed by a hash of its prompt, so any number of examples drawn with any seeds
stay disjoint.

``reverse`` (``reverse: abcde\\n`` -> ``edcba``) is learnt by the llama3 debug model on a CPU in a few
minutes; ``add`` (``add: 23+45\\n`` -> ``68``) is harder for it. ``arith`` (multi-step word problems,
``titanpod.data.word_problems``) has more structure and is scored by the last number of a completion.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from titanpod.models.choice import choose

Split = Literal["train", "test"]
"""Which side of a task's fixed train/test partition."""
SPLITS: tuple[Split, ...] = ("train", "test")
END_MARKERS = ("<|endoftext|>", "<|im_end|>")
"""Text that ends a completion when a decoded completion still holds it."""
TEST_SHARE = 8
"""One prompt in this many (by hash) belongs to the test split."""


@dataclass(frozen=True)
class Example:
    """One prompt and the answer that earns the full reward."""

    prompt: str
    """What the model is given, e.g. ``reverse: abcde\\n``."""
    answer: str
    """The exact completion that is right, e.g. ``edcba`` (without any end token)."""
    row: Mapping[str, Any] | None = field(default=None, compare=False)
    """The whole record the example came from (a user's file row), or ``None`` for a generated example."""

    def fields(self) -> Mapping[str, Any]:
        """The example's record: ``row`` when it came from one, else its prompt and answer."""
        return self.row if self.row is not None else {"prompt": self.prompt, "answer": self.answer}


@runtime_checkable
class Task(Protocol):
    """A task with a verifiable reward."""

    name: str
    """The name it is registered under (``reverse``, ``add``)."""
    description: str
    """One line saying what it asks."""
    characters: str
    """Every character its prompts and answers use (a tokenizer must cover them)."""

    def examples(self, split: Split, count: int, seed: int) -> list[Example]:
        """``count`` distinct examples of ``split``; the same arguments give the same list."""
        ...

    def reward(self, prompt: str, completion: str, answer: str) -> float:
        """1.0 when ``completion`` is the answer (see the module docstring), else 0.0."""
        ...

    def partial_reward(self, prompt: str, completion: str, answer: str) -> float:
        """1.0 for the answer; otherwise partial credit below 1.0 for how close the completion came."""
        ...

    def accuracy(self, examples: Sequence[Example], completions: Sequence[str]) -> float:
        """The share of ``examples`` whose completion earns the full reward."""
        ...


def completion_text(completion: str) -> str:
    """A completion cut at its first end marker and stripped of surrounding whitespace."""
    for marker in END_MARKERS:
        completion = completion.split(marker, 1)[0]
    return completion.strip()


def split_of(prompt: str) -> Split:
    """The split a prompt belongs to, fixed by its hash: one prompt in ``TEST_SHARE`` is ``test``."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:8], "big") % TEST_SHARE == 0 else "train"


class ExactMatchTask:
    """A task whose examples come from ``sample(rng)``, split by prompt hash, scored by exact match."""

    name = "exact_match"
    description = ""
    characters = ""

    def sample(self, rng: random.Random) -> Example:
        """One random example (of either split)."""
        raise NotImplementedError

    def examples(self, split: Split, count: int, seed: int) -> list[Example]:
        """``count`` distinct examples of ``split``, drawn with ``seed``.

        ``ValueError`` when ``split`` is unknown, ``count`` is negative, or the task has too few
        distinct examples of that split.
        """
        if split not in SPLITS:
            raise ValueError(f"Unknown split {split!r}; a task has the splits {', '.join(SPLITS)}.")
        if count < 0:
            raise ValueError(f"Ask a task for 0 or more examples, not {count}.")
        rng = random.Random(f"{self.name}/{split}/{seed}")
        found: dict[str, Example] = {}
        attempts, limit = 0, 50 * count + 1000
        while len(found) < count and attempts < limit:
            attempts += 1
            example = self.sample(rng)
            if example.prompt not in found and split_of(example.prompt) == split:
                found[example.prompt] = example
        if len(found) < count:
            raise ValueError(
                f"The task {self.name!r} gave only {len(found):,} distinct {split} examples in {limit:,} draws; "
                f"ask for fewer than {count:,}."
            )
        return list(found.values())

    def reward(self, prompt: str, completion: str, answer: str) -> float:
        """1.0 when the completion before its end marker, stripped, is exactly ``answer``; else 0.0."""
        return 1.0 if completion_text(completion) == answer.strip() else 0.0

    def partial_reward(self, prompt: str, completion: str, answer: str) -> float:
        """1.0 for exactly ``answer``; otherwise half the share of positions whose character is right (over the
        longer of completion and answer), so a near miss earns more than a wild one but never full credit."""
        done, answer = completion_text(completion), answer.strip()
        if done == answer:
            return 1.0
        right = sum(mine == theirs for mine, theirs in zip(done, answer, strict=False))
        return 0.5 * right / max(len(done), len(answer))

    def accuracy(self, examples: Sequence[Example], completions: Sequence[str]) -> float:
        """The share of ``examples`` whose completion earns reward 1.0 (0.0 for no examples)."""
        if len(examples) != len(completions):
            raise ValueError(f"{len(examples)} examples but {len(completions)} completions: give one per example.")
        if not examples:
            return 0.0
        rewards = [self.reward(ex.prompt, done, ex.answer) for ex, done in zip(examples, completions, strict=True)]
        return sum(reward == 1.0 for reward in rewards) / len(examples)


class ReverseTask(ExactMatchTask):
    """Reverse a short string of lowercase letters: ``reverse: abcde\\n`` -> ``edcba``."""

    name = "reverse"
    description = "reverse a string of 3 to 7 lowercase letters: 'reverse: abcde\\n' -> 'edcba'"
    characters = string.ascii_lowercase + "reverse: \n"

    def __init__(self, min_length: int = 3, max_length: int = 7) -> None:
        self.min_length, self.max_length = min_length, max_length

    def sample(self, rng: random.Random) -> Example:
        """A random string of ``min_length`` to ``max_length`` letters and its reverse."""
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(self.min_length, self.max_length)))
        return Example(f"reverse: {word}\n", word[::-1])


class AddTask(ExactMatchTask):
    """Add two numbers below 100: ``add: 23+45\\n`` -> ``68``."""

    name = "add"
    description = "add two numbers from 0 to 99: 'add: 23+45\\n' -> '68'"
    characters = string.digits + "add: +\n"

    def __init__(self, limit: int = 100) -> None:
        self.limit = limit

    def sample(self, rng: random.Random) -> Example:
        """Two random numbers below ``limit`` and their sum."""
        a, b = rng.randrange(self.limit), rng.randrange(self.limit)
        return Example(f"add: {a}+{b}\n", str(a + b))


def word_problems() -> Task:
    """The ``arith`` task (``titanpod.data.word_problems``, which builds on this module's classes)."""
    from titanpod.data.word_problems import WordProblemTask

    return WordProblemTask()


TASKS: Mapping[str, Callable[[], Task]] = {"reverse": ReverseTask, "add": AddTask, "arith": word_problems}
"""Every built-in task by name."""


def get_task(name: str) -> Task:
    """The built-in task called ``name``; ``KeyError`` lists the tasks and names the closest."""
    return choose("task", name, TASKS)()
