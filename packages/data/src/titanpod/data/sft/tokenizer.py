"""Tokenizers for post-training: a character-level one built in code, or any ``tokenizer.json``, with its
chat template.

The character tokenizer (``chars``) has one token per printable ASCII character, newline and space,
plus the special tokens ``<|pad|>``, ``<|endoftext|>``, ``<|unk|>`` and the chat markers
``<|im_start|>`` / ``<|im_end|>``: 101 tokens, so every built-in task fits any model vocabulary
(the llama3 debug model has 2048 rows). Its chat template is ChatML::

    <|im_start|>user\\nreverse: abc\\n<|im_end|>\\n<|im_start|>assistant\\ncba<|im_end|>\\n

A run saves the tokenizer as ``tokenizer.json`` plus ``tokenizer_config.json`` (the chat template
and the special tokens), which ``transformers.AutoTokenizer.from_pretrained`` reads.
Chat templates are rendered by ``transformers`` (imported only then).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from titanpod.data.tokenizer import END_OF_TEXT_CANDIDATES, end_of_text_id, resolve_tokenizer

CHARS = "chars"
"""``data.tokenizer`` value naming the built-in character tokenizer."""
PAD, END_OF_TEXT, UNKNOWN = "<|pad|>", "<|endoftext|>", "<|unk|>"
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, END_OF_TEXT, UNKNOWN, TURN_START, TURN_END)
"""The character tokenizer's special tokens, ids 0 to 4."""
CHARACTERS = "\n" + "".join(chr(code) for code in range(32, 127))
"""The character tokenizer's ordinary tokens: newline, space and printable ASCII."""
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The character tokenizer's chat template (ChatML)."""
END_OF_TURN_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")
"""Names a tokenizer may give the token that ends a chat turn (generation stops there too)."""
TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE = "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"


def character_tokenizer() -> Tokenizer:
    """The built-in character-level tokenizer (see the module docstring); unknown characters become ``<|unk|>``."""
    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    return tokenizer


class NoChatTemplateError(ValueError):
    """Chat records and a tokenizer without a chat template: a problem of the tokenizer, not of one record, so it
    is never skipped as a bad record (``data.bad_examples skip`` would skip every one)."""


@dataclass(frozen=True)
class SFTTokenizer:
    """A ``tokenizers.Tokenizer`` with what post-training needs around it: the end-of-text id (appended to
    every example), a pad id, the ids that stop generation, and the chat template, if any."""

    tokenizer: Tokenizer
    """The Hugging Face tokenizer."""
    spec: str
    """Where it came from (``chars`` or a path / Hub id), for messages."""
    chat_template: str | None = None
    """A Jinja chat template, or ``None`` (then only the plain prompt/response format is available)."""
    end_id: int = field(init=False)
    """The end-of-text id: ends every example and stops generation."""
    pad_id: int = field(init=False)
    """Fills rows after the last packed example (``<|pad|>`` when the tokenizer has it, else the end id)."""
    stop_ids: tuple[int, ...] = field(init=False)
    """Ids that end a generated completion: end of text, and end of turn when the tokenizer has one."""

    def __post_init__(self) -> None:
        try:
            end = end_of_text_id(self.tokenizer)
        except KeyError as error:
            raise ValueError(
                f"The tokenizer {self.spec!r} has none of the end-of-text tokens {', '.join(END_OF_TEXT_CANDIDATES)}; "
                "post-training ends every example with one. Use a tokenizer that has one, or --data.tokenizer chars."
            ) from error
        pad = self.tokenizer.token_to_id(PAD)
        turn_ends = [self.tokenizer.token_to_id(name) for name in END_OF_TURN_CANDIDATES]
        object.__setattr__(self, "end_id", end)
        object.__setattr__(self, "pad_id", end if pad is None else pad)
        object.__setattr__(self, "stop_ids", (end, *sorted({i for i in turn_ends if i is not None and i != end})))

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary, special tokens included."""
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token text such as ``<|im_end|>`` becomes its id; nothing is added)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of each text."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens left out."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @cached_property
    def _chat(self) -> Any:
        if self.chat_template is None:
            raise NoChatTemplateError(
                f"the tokenizer {self.spec!r} has no chat template, and chat records (messages, or --data.format "
                "chat) are rendered through one. Give the records as prompt/response pairs with --data.format "
                f"plain, or name a tokenizer of the model's vocabulary that has one: --data.tokenizer FOLDER, whose "
                f"{CONFIG_FILE} holds a chat_template (or beside it a {TEMPLATE_FILE})."
            )
        try:
            from transformers import PreTrainedTokenizerFast
        except ImportError as error:
            raise ValueError(
                "Chat templates are rendered by transformers, which is not installed: pip install 'transformers>=5'."
            ) from error
        specials = {"eos_token": self.tokenizer.id_to_token(self.end_id)}
        if self.tokenizer.token_to_id(PAD) is not None:
            specials["pad_token"] = PAD
        return PreTrainedTokenizerFast(tokenizer_object=self.tokenizer, chat_template=self.chat_template, **specials)

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        """The chat template applied to ``messages`` (``{"role", "content"}`` dicts), as text."""
        return self._chat.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    def config(self) -> dict[str, Any]:
        """``tokenizer_config.json`` content: tokenizer class, special tokens and chat template."""
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": self.tokenizer.id_to_token(self.end_id),
            "pad_token": self.tokenizer.id_to_token(self.pad_id),
            "clean_up_tokenization_spaces": False,
        }
        if self.tokenizer.token_to_id(UNKNOWN) is not None:
            config["unk_token"] = UNKNOWN
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config

    def files(self) -> dict[str, str]:
        """``tokenizer.json`` and ``tokenizer_config.json`` as text, by file name."""
        return {
            TOKENIZER_FILE: self.tokenizer.to_str(pretty=True),
            CONFIG_FILE: json.dumps(self.config(), indent=2) + "\n",
        }

    def save(self, directory: Path | str) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``; return the first."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in self.files().items():
            (directory / name).write_text(text, encoding="utf-8")
        return directory / TOKENIZER_FILE


def read_chat_template(folder: Path) -> str | None:
    """The chat template a tokenizer folder holds: ``chat_template.jinja``, or ``chat_template`` in
    ``tokenizer_config.json`` (a string, or a list of named templates whose ``default`` is taken)."""
    if (folder / TEMPLATE_FILE).is_file():
        return (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    path = folder / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    except (json.JSONDecodeError, AttributeError) as error:
        raise ValueError(f"{path} is not a JSON object: {error}") from error
    if isinstance(template, list):
        named = {item.get("name"): item.get("template") for item in template if isinstance(item, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def load_sft_tokenizer(spec: str | None) -> SFTTokenizer:
    """The tokenizer ``spec`` names: ``chars`` (built in, with the ChatML template; also ``None``), a
    ``tokenizer.json`` or a folder holding one (its chat template read beside it), or a Hub model id (no chat
    template)."""
    if spec is None or spec == CHARS:
        return SFTTokenizer(character_tokenizer(), CHARS, CHATML_TEMPLATE)
    tokenizer = resolve_tokenizer(spec)
    path = Path(spec)
    folder = path if path.is_dir() else path.parent if path.is_file() else None
    return SFTTokenizer(tokenizer, spec, read_chat_template(folder) if folder is not None else None)
