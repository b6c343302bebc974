"""Supervised fine-tuning records: prompt/response or chat records tokenized into examples with the loss on
response tokens only, read from a built-in task or local JSON lines, with bad records named or skipped.

An example is prompt tokens + response tokens + the end-of-text token. Its inputs are every token but
the last, and its labels the tokens one ahead, ``IGNORE_INDEX`` wherever that next token belongs to the
prompt: the model learns to write the response and to stop, never to predict the prompt. Example::

    tokens  p0  p1  p2  r0  r1  END
    inputs  p0  p1  p2  r0  r1
    labels  --  --  r0  r1  END           (-- is IGNORE_INDEX)

Records come from a built-in task (``data.source task``) or local JSON lines (``data.source jsonl``,
read through the ``datasets`` library) holding ``{"prompt", "response"}`` or ``{"messages": [{"role",
"content"}, ...]}``; messages go through the tokenizer's chat template and the loss covers every
assistant turn. A bad record (a missing field, or too long for ``seq_len``) is an error naming the
example's index, or with ``data.bad_examples skip`` a counted skip reported at the start of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from titanpod.data.config import DataConfig
from titanpod.data.sft.config import SFTDataConfig
from titanpod.data.sft.tokenizer import NoChatTemplateError, SFTTokenizer
from titanpod.data.sources import DataError, data_files, decode_error, quiet_datasets, read_error, silenced
from titanpod.data.tasks import Task
from titanpod.models import IGNORE_INDEX

Record = dict[str, Any]
"""One training record: ``{"prompt", "response"}`` or ``{"messages": [...]}``."""
SHOWN_SKIPS = 3
"""Reasons of skipped examples named in the run's description (the rest are counted)."""


class BadExample(DataError):
    """One record cannot be used; the message names its index and what is wrong."""


@dataclass(frozen=True)
class SFTExample:
    """One tokenized example: model inputs and next-token labels, ``IGNORE_INDEX`` where not trained on."""

    inputs: list[int]
    """Token ids fed to the model (every token of the example but the last)."""
    labels: list[int]
    """The token after each input, or ``IGNORE_INDEX`` where that token belongs to the prompt."""

    def __len__(self) -> int:
        return len(self.inputs)


def example_from_segments(segments: Sequence[tuple[list[int], bool]]) -> SFTExample:
    """An example from token segments in order, each marked trained (response) or not (prompt)."""
    tokens: list[int] = []
    trained: list[bool] = []
    for ids, train in segments:
        tokens.extend(ids)
        trained.extend([train] * len(ids))
    labels = [token if train else IGNORE_INDEX for token, train in zip(tokens[1:], trained[1:], strict=True)]
    return SFTExample(tokens[:-1], labels)


def prompt_text(tokenizer: SFTTokenizer, prompt: str, format: str) -> str:
    """What the model sees before it answers ``prompt``: the prompt itself (``plain``), or the prompt as a
    user message followed by the assistant's turn start (``chat``)."""
    if format == "chat":
        return tokenizer.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return prompt


def chat_segments(tokenizer: SFTTokenizer, messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
    """The rendered conversation cut into text pieces, each marked trained (an assistant turn) or not.

    Each assistant turn is what rendering through it adds to rendering up to it with the generation
    prompt; ``ValueError`` when the template does not render each conversation as a prefix of the next.
    """
    pieces: list[tuple[str, bool]] = []
    done = ""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.render_chat(messages[:index], add_generation_prompt=True)
        through = tokenizer.render_chat(messages[: index + 1])
        if not before.startswith(done) or not through.startswith(before):
            raise ValueError(
                "the chat template does not render the conversation up to an assistant turn as a prefix of the "
                "conversation through it, so the turn's tokens cannot be told apart"
            )
        pieces += [(before[len(done) :], False), (through[len(before) :], True)]
        done = through
    rest = tokenizer.render_chat(messages)[len(done) :]
    return [*pieces, (rest, False)] if rest else pieces


def _text(record: Record, name: str) -> str:
    value = record.get(name)
    if value is None:
        raise ValueError(
            f"it has no {name!r}: each record needs 'prompt' and 'response' (text), or 'messages' "
            "(a list of {'role', 'content'})"
        )
    if not isinstance(value, str):
        raise ValueError(f"its {name!r} is {type(value).__name__}, not text")
    return value


def _messages(record: Record) -> list[dict[str, str]]:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("its 'messages' is not a non-empty list of {'role', 'content'}")
    checked = []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"its message {number} has no 'role'")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"its message {number} has no text 'content'")
        checked.append({"role": message["role"], "content": message["content"]})
    if not any(message["role"] == "assistant" for message in checked):
        raise ValueError("its messages hold no assistant message to train on")
    return checked


def encode_record(tokenizer: SFTTokenizer, record: Record, format: str) -> SFTExample:
    """Tokenize one record (prompt/response in ``format``, or messages through the chat template),
    ending it with the end-of-text token; ``ValueError`` says what is wrong with the record."""
    if record.get("messages") is not None:
        pieces = chat_segments(tokenizer, _messages(record))
    else:
        prompt, response = _text(record, "prompt"), _text(record, "response")
        pieces = [(prompt_text(tokenizer, prompt, format), False), (response, True)]
        if format == "chat":
            full = tokenizer.render_chat(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
            )
            if not full.startswith(pieces[0][0]):
                raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
            pieces[1] = (full[len(pieces[0][0]) :], True)
    segments = [(tokenizer.encode(text), train) for text, train in pieces if text]
    if not any(train and ids for ids, train in segments):
        raise ValueError("its response is empty")
    return example_from_segments([*segments, ([tokenizer.end_id], True)])


@dataclass
class ExampleSet:
    """Tokenized examples and the records skipped on the way."""

    examples: list[SFTExample]
    """The usable examples, in record order."""
    skipped: list[str] = field(default_factory=list)
    """Why each skipped record was skipped (names its index)."""


def encode_records(records: Sequence[Record], tokenizer: SFTTokenizer, config: SFTDataConfig, where: str) -> ExampleSet:
    """Tokenize every record; a bad one raises ``BadExample`` naming its index in ``where``, or is skipped
    and listed with ``config.bad_examples == "skip"``."""
    result = ExampleSet([])
    for index, record in enumerate(records):
        try:
            example = encode_record(tokenizer, record, config.format)
            if len(example) > config.seq_len:
                raise ValueError(
                    f"it is {len(example) + 1} tokens with the end token, taking {len(example)} positions, more than "
                    f"data.seq_len {config.seq_len}"
                )
        except NoChatTemplateError as error:  # every chat record would fail alike: not a bad record
            raise NoChatTemplateError(f"{where}: {error}") from error
        except ValueError as error:
            reason = f"example {index} of {where}: {error}"
            if config.bad_examples == "skip":
                result.skipped.append(reason)
                continue
            raise BadExample(
                f"{reason}. Fix the record, or skip bad records with --data.bad-examples skip"
                + (" (or raise --data.seq-len)." if "data.seq_len" in str(error) else ".")
            ) from error
        result.examples.append(example)
    if not result.examples:
        raise DataError(f"{where} holds no usable examples ({len(result.skipped)} skipped).")
    return result


def read_jsonl_records(config: SFTDataConfig) -> tuple[list[Record], str]:
    """The records of local JSON / JSON lines files (through ``datasets``), and words naming them."""
    import datasets

    files = data_files(DataConfig(source="jsonl", path=config.path))
    where = files[0] if len(files) == 1 else f"{config.path} ({len(files)} files, in name order)"
    quiet_datasets()
    try:
        with silenced():
            table = datasets.load_dataset("json", data_files={"train": files}, split="train")
    except Exception as error:  # the library raises many types (ArrowInvalid, DatasetGenerationError, ...)
        raise read_error(error, files, "jsonl") from error
    if not {"messages", "prompt", "response"} & set(table.column_names):
        raise DataError(
            f"{where} has the fields {', '.join(table.column_names)}; SFT records need 'prompt' and 'response', "
            "or 'messages'."
        )
    try:
        return list(table), where
    except UnicodeDecodeError as error:  # found only as the table's strings are read
        raise (decode_error(files, "jsonl") or read_error(error, files, "jsonl")) from error


def task_records(task: Task, count: int, seed: int) -> list[Record]:
    """``count`` training examples of ``task`` as prompt/response records."""
    return [{"prompt": ex.prompt, "response": ex.answer} for ex in task.examples("train", count, seed)]


def check_covers(tokenizer: SFTTokenizer, task: Task) -> None:
    """Refuse a tokenizer that cannot write every character the task uses."""
    missing = [char for char in task.characters if tokenizer.decode(tokenizer.encode(char)) != char]
    if missing:
        raise ValueError(
            f"The tokenizer {tokenizer.spec!r} cannot encode the characters {''.join(sorted(set(missing)))!r} of the "
            f"task {task.name!r}; use --data.tokenizer chars."
        )
