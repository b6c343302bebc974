"""What an SFT run fine-tunes on: the typed data section of SFT recipes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from titanpod.data.config import closest
from titanpod.data.tasks import TASKS
from titanpod.models.field_checks import expand_home

SFTSource = Literal["task", "jsonl"]
"""What ``SFTDataConfig.source`` accepts."""
PromptFormat = Literal["plain", "chat"]
"""How prompt/response records are laid out (``SFTDataConfig.format``, ``GRPOConfig.format``)."""
BadExamples = Literal["error", "skip"]
"""What ``SFTDataConfig.bad_examples`` accepts."""
TaskName = Literal["reverse", "add", "arith"]
"""A built-in task (``titanpod.data.tasks.TASKS``)."""

SFT_SOURCES: tuple[str, ...] = get_args(SFTSource)
"""Every value ``SFTDataConfig.source`` accepts."""
FORMATS: tuple[str, ...] = get_args(PromptFormat)
"""Every value ``SFTDataConfig.format`` accepts."""
BAD_EXAMPLES: tuple[str, ...] = get_args(BadExamples)
"""Every value ``SFTDataConfig.bad_examples`` accepts."""


def choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """``ValueError`` naming ``name`` and the closest choice when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}.{closest(value, choices)}")


@dataclass(frozen=True)
class SFTDataConfig:
    """What the run fine-tunes on and how examples become batches."""

    source: SFTSource = "task"
    """``task`` (a built-in task's generated train split) or ``jsonl`` (local JSON lines records)."""
    task: TaskName = "reverse"
    """``source task``: the built-in task (``reverse``, ``add``, ``arith``)."""
    train_examples: int = 20_000
    """``source task``: distinct training examples generated (with ``train.seed``)."""
    path: str | None = None
    """``source jsonl``: a file, directory or glob of ``{"prompt", "response"}`` or ``{"messages"}`` records."""
    format: PromptFormat = "plain"
    """How prompt/response records are laid out: ``plain`` (prompt text, then the response) or ``chat`` (a user
    and an assistant message through the tokenizer's chat template). Messages always use the chat template."""
    tokenizer: str | None = None
    """``chars`` (built-in character tokenizer with a ChatML template), a ``tokenizer.json`` path or its folder
    (the folder's tokenizer_config.json / chat_template.jinja gives the chat template), or a Hub model id.
    ``None``: the tokenizer (and chat template) of ``model.init_from`` when that folder has one, else ``chars``."""
    seq_len: int = 128
    """Positions per packed row; an example longer than this is a bad example."""
    batch_size: int = 16
    """Packed rows per batch."""
    bad_examples: BadExamples = "error"
    """A record that is missing a field or too long: ``error`` (stop, naming its index) or ``skip`` (count it and
    report the skips at the start of the run)."""

    def __post_init__(self) -> None:
        expand_home(self, "path", "tokenizer")
        choice("data.source", self.source, SFT_SOURCES)
        choice("data.format", self.format, FORMATS)
        choice("data.bad_examples", self.bad_examples, BAD_EXAMPLES)
        choice("data.task", self.task, tuple(TASKS))
        if self.source == "jsonl" and not self.path:
            raise ValueError("data.source 'jsonl' needs data.path: a file, directory or glob of JSON lines records.")
        if self.source == "task" and self.path is not None:
            raise ValueError("data.path is not read for data.source 'task'; drop it, or set data.source jsonl.")
        if self.train_examples < 1:
            raise ValueError(f"data.train_examples must be at least 1, got {self.train_examples}.")
        if self.seq_len < 2:
            raise ValueError(f"data.seq_len must be at least 2, got {self.seq_len}.")
        if self.batch_size < 1:
            raise ValueError(f"data.batch_size must be at least 1, got {self.batch_size}.")
