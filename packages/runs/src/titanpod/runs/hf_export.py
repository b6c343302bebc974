"""What a trained model's Hugging Face folder carries besides its weights: the run's tokenizer, the special
token ids it gives the model, and a model card saying how the model was made (family, flavor, parameters,
steps, tokens, data, final loss, the recipe)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from titanpod.checkpoint.model_card import CARD_FILE, ModelCard
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
    """A recipe's data section in words, e.g. ``jsonl data/*.jsonl, tokenizer builtin``."""
    source = str(data.get("source", "?"))
    where = data.get("path") or data.get("name") or data.get("task")
    words = f"{source} {where}" if where else source
    return f"{words}, tokenizer {data['tokenizer']}" if data.get("tokenizer") else words


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
) -> HFExtras:
    """The extras of a model trained by ``recipe`` (a recipe's ``to_dict``): its data's tokenizer (or ``tokenizer``,
    files and ids, when the run has them at hand), and a card with what is known of the training."""
    data = recipe.get("data", {})
    files, special_tokens = tokenizer if tokenizer is not None else run_tokenizer(data)
    card = ModelCard(
        family=family,
        parameters=parameters,
        flavor=recipe.get("model", {}).get("flavor"),
        steps=steps,
        tokens=tokens,
        data=describe_data(data) if data else None,
        final_loss=final_loss,
        recipe=dict(recipe),
        notes=notes or [],
    )
    finite_loss = final_loss if final_loss is not None and math.isfinite(final_loss) else None  # model.json is JSON
    about = {"steps": steps, "tokens": tokens, "final_loss": finite_loss}
    return HFExtras(special_tokens, files, card, {key: value for key, value in about.items() if value is not None})
