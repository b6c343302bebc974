"""A post-training task from a user's own prompts and reference answers: a JSON lines or Parquet file, or a
Hugging Face Hub dataset (``hub:owner/name``), read through ``datasets`` (imported lazily).

Each row gives a prompt and its reference answer in named columns; the whole row travels with its
example, so a user's reward can read any other column. Without a separate held-out source the rows
split as the built-in tasks' prompts do: by a hash of the prompt, one in ``TEST_SHARE`` held out.
Every failure is a ``DataError`` naming the file or dataset, the column or row, and the fix.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titanpod.data.answers import number_reward
from titanpod.data.sources import DataError, quiet_datasets, read_error, silenced
from titanpod.data.tasks import SPLITS, ExactMatchTask, Example, Split, split_of

HUB_PREFIX = "hub:"
"""How a task source names a Hub dataset rather than a local file: ``hub:openai/gsm8k``."""
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""The ``datasets`` builder that reads each file suffix."""


@dataclass(frozen=True)
class TaskSource:
    """Where a task's rows come from and which columns hold the prompt and the answer."""

    path: str
    """A ``.jsonl`` / ``.json`` / ``.parquet`` file, or ``hub:owner/name`` for a Hub dataset."""
    prompt_column: str = "prompt"
    """The column holding each prompt (text)."""
    answer_column: str = "answer"
    """The column holding each reference answer (text or a number)."""
    split: str = "train"
    """The Hub dataset's split to read (a local file is read whole)."""
    field: str = "grpo.data_path"
    """The setting that named ``path``, for messages."""


def read_rows(source: TaskSource) -> list[dict[str, Any]]:
    """Every row of ``source`` as a dict; ``DataError`` for a missing file, an unknown suffix, a file or dataset
    that cannot be read, no rows, or a missing prompt or answer column."""
    import datasets

    quiet_datasets()
    if source.path.startswith(HUB_PREFIX):
        name = source.path[len(HUB_PREFIX) :]
        try:
            with silenced():
                table = datasets.load_dataset(name, split=source.split)
        except Exception as error:  # network, unknown dataset or split: the library raises many types
            raise DataError(
                f"{source.field} {source.path!r}: cannot load the Hub dataset {name!r} (split {source.split!r}): "
                f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}. Check the name and "
                "split, and the network (or download it and give the local .jsonl or .parquet file)."
            ) from error
        where = f"the Hub dataset {name} ({source.split})"
    else:
        path = Path(source.path)
        builder = BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DataError(
                f"{source.field} {source.path!r} is neither a {', '.join(BUILDERS)} file nor hub:owner/name: give "
                "a JSON lines or Parquet file of prompts and answers, or a Hub dataset as hub:owner/name."
            )
        if not path.is_file():
            raise DataError(
                f"{source.field} {source.path!r}: no such file (looked in {Path.cwd()} for a relative path). Check "
                "the path, or write the file: one row per prompt with its reference answer."
            )
        if path.stat().st_size == 0:
            raise DataError(
                f"{source.field} {source.path!r} is empty (0 bytes): no prompts to read. Fill it (a download or "
                "copy that did not finish?), one row per prompt with its reference answer, or name another file."
            )
        try:
            with silenced():
                table = datasets.load_dataset(builder, data_files={"train": [str(path)]}, split="train")
        except Exception as error:  # ArrowInvalid, DatasetGenerationError, ...
            raise read_error(error, [str(path)], builder) from error
        where = str(path)
    check_columns(list(table.column_names), source, where)
    rows = [dict(row) for row in table]
    if not rows:
        raise DataError(f"{where} has no rows: {source.field} needs at least one prompt with its answer.")
    return rows


def check_columns(columns: list[str], source: TaskSource, where: str) -> None:
    """``DataError`` naming the columns present and the flag to set when the prompt or answer column is missing."""
    for column, flag in ((source.prompt_column, "prompt-column"), (source.answer_column, "answer-column")):
        if column not in columns:
            raise DataError(
                f"{where} has no column {column!r} (its columns: {', '.join(columns) or 'none'}): name the "
                f"column that holds it with --grpo.{flag}, or add it to every row."
            )


def examples_of(rows: list[dict[str, Any]], source: TaskSource, where: str) -> list[Example]:
    """The rows as examples (the answer as text); ``DataError`` naming a row whose prompt is not text or empty,
    or whose answer is missing."""
    examples = []
    for index, row in enumerate(rows):
        prompt, answer = row.get(source.prompt_column), row.get(source.answer_column)
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(
                f"Row {index} of {where} has no prompt text in column {source.prompt_column!r} (got {prompt!r}): "
                "every row needs a non-empty prompt."
            )
        if answer is None:
            raise DataError(
                f"Row {index} of {where} has no answer in column {source.answer_column!r}: every row needs its "
                "reference answer."
            )
        examples.append(Example(prompt, str(answer), row))
    return examples


class FileTask(ExactMatchTask):
    """The examples of a user's rows, scored by exact match or (``numeric``) by the last number written."""

    description = "prompts and reference answers from a file"

    def __init__(self, train: list[Example], test: list[Example] | None, name: str, numeric: bool) -> None:
        """``train`` rows (and ``test`` rows, else a hash split of ``train``); ``name`` says where they came from;
        ``numeric`` scores by ``number_reward`` instead of exact match."""
        self.name = name
        if test is None:
            test = [example for example in train if split_of(example.prompt) == "test"]
            train = [example for example in train if split_of(example.prompt) == "train"]
        self.rows: dict[Split, list[Example]] = {"train": train, "test": test}
        self.numeric = numeric
        self.characters = "".join(
            sorted({char for example in train + test for char in example.prompt + example.answer})
        )

    def examples(self, split: Split, count: int, seed: int) -> list[Example]:
        """``count`` examples of ``split`` drawn with ``seed`` without repeats; every one, shuffled, when the split
        has fewer than ``count`` (a held-out file may be small); ``ValueError`` for a train split too small."""
        if split not in SPLITS:
            raise ValueError(f"Unknown split {split!r}; a task has the splits {', '.join(SPLITS)}.")
        rows = self.rows[split]
        if split == "train" and len(rows) < count:
            raise DataError(
                f"{self.name} has {len(rows)} training rows, fewer than the {count} prompts a step takes: lower "
                "--grpo.prompts-per-step or add rows."
            )
        rng = random.Random(f"{self.name}/{split}/{seed}")
        return rng.sample(rows, min(count, len(rows)))

    def reward(self, prompt: str, completion: str, answer: str) -> float:
        """``number_reward`` when ``numeric``, else 1.0 for exactly the answer (see ``ExactMatchTask``)."""
        if self.numeric:
            return number_reward(prompt, completion, answer)
        return super().reward(prompt, completion, answer)


def load_file_task(train: TaskSource, test: TaskSource | None, numeric: bool) -> FileTask:
    """The task of ``train``'s rows, held out by ``test``'s rows when given (else by prompt hash)."""
    train_examples = examples_of(read_rows(train), train, train.path)
    test_examples = None if test is None else examples_of(read_rows(test), test, test.path)
    name = train.path if train.path.startswith(HUB_PREFIX) else Path(train.path).name
    return FileTask(train_examples, test_examples, name, numeric)
