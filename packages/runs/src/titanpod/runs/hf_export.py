"""What a trained model's Hugging Face folder carries besides its weights: the run's tokenizer, the special
token ids it gives the model, and a model card saying how the model was made (family, flavor, parameters,
license, base model, data, steps, tokens, final loss, held-out accuracy, the recipe)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titanpod.checkpoint.model_card import CARD_FILE, DEFAULT_LICENSE, ModelCard, is_local_path, local_name
from titanpod.checkpoint.model_files import MODEL_FILE, read_model_file
from titanpod.checkpoint.special_tokens import SpecialTokens
from titanpod.data.sft.tokenizer import SFTTokenizer
from titanpod.data.tokenizer_export import TokenizerExport, post_training_export, tokenizer_export


@dataclass(frozen=True)
class HFExtras:
    """The files and ids that go with a model's weights into a Hugging Face folder."""

    special_tokens: SpecialTokens
    """bos, eos and pad ids: into config.json and generation_config.json."""
    tokenizer_files: dict[str, str | bytes]
    """tokenizer.json and its config files (empty when the run had no tokenizer, e.g. synthetic data)."""
    card: ModelCard
    """The model card (README.md)."""
    about: dict[str, Any] = field(default_factory=dict)
    """Facts for model.json's ``about``: steps, tokens, final loss."""

    def hf_files(self) -> dict[str, str | bytes]:
        """Every file beside the weights: the tokenizer's and README.md."""
        return {**self.tokenizer_files, CARD_FILE: self.card.render()}


def describe_data(data: Mapping[str, Any]) -> str:
    """A recipe's data section in words, e.g. ``jsonl train.jsonl, tokenizer builtin``; a local path by its last
    part (a card never names a folder of this machine)."""
    source = str(data.get("source", "?"))
    where = data.get("path") or data.get("name") or data.get("task")
    if isinstance(where, str):
        where = local_name(where)
    words = f"{source} {where}" if where else source
    tokenizer = data.get("tokenizer")
    if isinstance(tokenizer, str):
        tokenizer = local_name(tokenizer)
    return f"{words}, tokenizer {tokenizer}" if tokenizer else words


def data_names(data: Mapping[str, Any]) -> list[str]:
    """The training data as a card's ``datasets``: a Hub dataset's id, ``titanpod-builtin`` for the built-in
    corpus, ``titanpod-<task>`` for a built-in task; none for files and synthetic data."""
    source = data.get("source")
    if source == "hub" and data.get("path"):
        return [str(data["path"])]
    if source == "builtin":
        return ["titanpod-builtin"]
    if source == "task" and data.get("task"):
        return [f"titanpod-{data['task']}"]
    return []


def training_kind(recipe: Mapping[str, Any]) -> str:
    """``grpo``, ``sft`` or ``pretraining``: what a recipe (``to_dict``) trains, by the sections it has."""
    if "grpo" in recipe:
        return "grpo"
    return "sft" if "eval" in recipe else "pretraining"


def hub_id(source: str | None) -> str | None:
    """``source`` when it names a Hub model (``org/name``, not a folder here); else ``None``."""
    if not source or is_local_path(source) or source.count("/") != 1 or Path(source).exists():
        return None
    return source


def base_model_of(init_from: str | None) -> str | None:
    """The Hub model a fine-tune starts from: ``init_from`` when it is a Hub id, else the Hub model a local titanpod
    folder records (``model.json``'s ``about``: ``base_model``, or the ``source`` it was imported from); ``None``
    when there is none (a folder is never named)."""
    if init_from is None:
        return None
    if (named := hub_id(init_from)) is not None:
        return named
    folder = Path(init_from)
    if not (folder / MODEL_FILE).is_file():
        return None
    try:
        about = read_model_file(folder).get("about", {})
    except ValueError:
        return None
    return hub_id(about.get("base_model")) or hub_id(about.get("source"))


def _files_and_ids(export: TokenizerExport) -> tuple[dict[str, str | bytes], SpecialTokens]:
    return dict(export.files), SpecialTokens(export.bos_id, export.eos_id, export.pad_id)


def run_tokenizer(data: Mapping[str, Any]) -> tuple[dict[str, str | bytes], SpecialTokens]:
    """The tokenizer files and special ids of a recipe's data section (none for synthetic data)."""
    spec = data.get("tokenizer")
    if not spec or data.get("source") == "synthetic":
        return {}, SpecialTokens()
    return _files_and_ids(tokenizer_export(str(spec), data.get("tokenizer_revision")))


def post_training_tokenizer(tokenizer: SFTTokenizer) -> tuple[dict[str, str | bytes], SpecialTokens]:
    """A post-training run's tokenizer files (chat template included) and ids (eos: every stop id)."""
    return _files_and_ids(post_training_export(tokenizer))


def training_extras(
    recipe: Mapping[str, Any],
    family: str,
    parameters: int,
    steps: int | None,
    tokens: int | None = None,
    final_loss: float | None = None,
    notes: list[str] | None = None,
    tokenizer: tuple[dict[str, str | bytes], SpecialTokens] | None = None,
    accuracy: float | None = None,
    accuracy_task: str | None = None,
) -> HFExtras:
    """The extras of a model trained by ``recipe`` (a recipe's ``to_dict``): its data's tokenizer (or ``tokenizer``,
    files and ids, when the run has them at hand), and a card with what is known of the training: its license
    (``output.license``), the Hub model it was fine-tuned from, its data, the final loss and ``accuracy`` (held-out,
    after training, on ``accuracy_task``) where the run scored one."""
    data = recipe.get("data", {})
    files, special_tokens = tokenizer if tokenizer is not None else run_tokenizer(data)
    base_model = base_model_of(recipe.get("model", {}).get("init_from"))
    license_id = recipe.get("output", {}).get("license") or DEFAULT_LICENSE
    finite_loss = final_loss if final_loss is not None and math.isfinite(final_loss) else None  # model.json is JSON
    card = ModelCard(
        family=family,
        parameters=parameters,
        flavor=recipe.get("model", {}).get("flavor"),
        steps=steps,
        tokens=tokens,
        data=describe_data(data) if data else None,
        final_loss=finite_loss,
        recipe=dict(recipe),
        notes=notes or [],
        license=license_id,
        base_model=base_model,
        datasets=data_names(data),
        task=training_kind(recipe),
        accuracy=accuracy,
        accuracy_task=accuracy_task,
    )
    about = {
        "steps": steps,
        "tokens": tokens,
        "final_loss": finite_loss,
        "license": license_id,
        "base_model": base_model,
        "datasets": card.datasets or None,
        "task": card.task,
        "accuracy": accuracy,
        "accuracy_task": accuracy_task if accuracy is not None else None,
    }
    return HFExtras(special_tokens, files, card, {key: value for key, value in about.items() if value is not None})
