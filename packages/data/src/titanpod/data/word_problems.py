"""``arith``: multi-step arithmetic word problems, generated from a seed, with a verifiable numeric answer.

``Ann has 7 pens. She gets 5 more. She gives 3 away. How many pens does Ann have?\\n`` -> ``9``.

Each problem starts from a count and applies two or three steps (getting more, giving some away,
or, rarely, doubling), and the count never drops below zero. The answer is one number, so a
completion is right when the last number it writes is the answer (``titanpod.data.answers``).
Like every built-in task, a prompt's split (train or test) is fixed by its hash, so held-out
problems are never trained on.
"""

from __future__ import annotations

import random
import string

from titanpod.data.answers import number_reward
from titanpod.data.tasks import ExactMatchTask, Example

NAMES = ("Ann", "Ben", "Cal", "Dee", "Eli", "Fay", "Gus", "Ivy", "Jo", "Kim")
ITEMS = ("apples", "pens", "cards", "coins", "shells", "books", "stamps", "beads")
PRONOUNS = {"Ann": "She", "Dee": "She", "Fay": "She", "Ivy": "She", "Kim": "She"}
"""Each name's pronoun (``He`` when not listed)."""


class WordProblemTask(ExactMatchTask):
    """Two- or three-step counting word problems with numbers below ``limit``; the answer is the final count."""

    name = "arith"
    description = "multi-step word problems: 'Ann has 7 pens. She gets 5 more. She gives 3 away. ...' -> '9'"
    characters = string.ascii_letters + string.digits + " .?\n"

    def __init__(self, limit: int = 10) -> None:
        self.limit = limit

    def step(self, rng: random.Random, count: int, pronoun: str) -> tuple[str, int]:
        """One step applied to ``count``: its sentence and the new count."""
        kind = rng.choices(("more", "away", "double"), weights=(4, 4, 1))[0]
        if kind == "away" and count > 0:
            taken = rng.randint(1, count)
            return f"{pronoun} gives {taken} away.", count - taken
        if kind == "double" and count <= self.limit:
            return f"{pronoun} doubles them.", count * 2
        added = rng.randint(1, self.limit - 1)
        return f"{pronoun} gets {added} more.", count + added

    def sample(self, rng: random.Random) -> Example:
        """A random problem of two or three steps and its final count."""
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        pronoun = PRONOUNS.get(name, "He")
        count = rng.randint(1, self.limit - 1)
        sentences = [f"{name} has {count} {item}."]
        for _ in range(rng.randint(2, 3)):
            sentence, count = self.step(rng, count, pronoun)
            sentences.append(sentence)
        sentences.append(f"How many {item} does {name} have?")
        return Example(" ".join(sentences) + "\n", str(count))

    def reward(self, prompt: str, completion: str, answer: str) -> float:
        """1.0 when the last number of the completion is the answer (``number_reward``), else 0.0."""
        return number_reward(prompt, completion, answer)
