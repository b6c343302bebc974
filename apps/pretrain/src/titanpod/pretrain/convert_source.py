"""What ``titanpod-convert export`` reads: a titanpod model folder, a trainer checkpoint, or a run directory, each
as the model plus everything its Hugging Face folder carries (tokenizer files, special token ids, model card).

- a titanpod model folder (``model.json``: ``<run>/model`` or an ``import``): its weights, the ids and facts
  ``model.json`` records, its tokenizer and generation files (else the tokenizer of the recipe.json beside it);
- a trainer checkpoint (``<run>/checkpoints/step-NNNNNN``, holding ``trainer.json``): the parameters of its
  trainer state, built to the shape of its recipe, with the recipe's tokenizer;
- a run directory: its final ``model/`` folder when the run wrote one, else its newest complete checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titanpod.checkpoint import load_model
from titanpod.checkpoint.companion_files import read_companions
from titanpod.checkpoint.model_card import DEFAULT_LICENSE, ModelCard
from titanpod.checkpoint.model_files import MODEL_FILE, read_model_file
from titanpod.checkpoint.special_tokens import SpecialTokens
from titanpod.checkpoint.trainer_weights import is_trainer_checkpoint, newest_trainer_checkpoint
from titanpod.models import Transformer, parameter_count
from titanpod.runs.hf_export import data_names, describe_data, hub_id, run_tokenizer, training_kind
from titanpod.runs.trainer_export import read_trainer_model

RECIPE_FILE = "recipe.json"
"""The recipe a run saves beside its final weights."""


@dataclass(frozen=True)
class ExportSource:
    """A model to export and what goes with it."""

    family: str
    """titanpod model family."""
    model: Transformer
    """The model, on the CPU."""
    special_tokens: SpecialTokens
    """bos, eos and pad ids for config.json and generation_config.json."""
    files: dict[str, str | bytes]
    """Files beside the weights: tokenizer, generation config (when the source has its own)."""
    card: ModelCard
    """The model card."""
    read_from: Path
    """The folder the weights were read from."""

    @property
    def attention_window(self) -> int | None:
        """The attention window the model was trained with: its recipe's ``kernels.window``."""
        return ((self.card.recipe or {}).get("kernels") or {}).get("window")


def open_export_source(path: Path) -> ExportSource:
    """The model folder, trainer checkpoint or run directory at ``path``, read (see the module docstring)."""
    path = Path(path)
    if (path / MODEL_FILE).is_file():
        return _model_folder(path)
    if is_trainer_checkpoint(path):
        return _trainer_checkpoint(path)
    if (path / "model" / MODEL_FILE).is_file():
        return _model_folder(path / "model")
    newest = newest_trainer_checkpoint(path) if path.is_dir() else None
    if newest is not None:
        return _trainer_checkpoint(newest)
    raise FileNotFoundError(
        f"No {MODEL_FILE} in {path}: not a titanpod model checkpoint, nor a trainer checkpoint (trainer.json), nor a "
        "run directory with model/ or checkpoints/. Give <run>/model, <run>/checkpoints/step-NNNNNN or <run>."
    )


def _trainer_checkpoint(folder: Path) -> ExportSource:
    read = read_trainer_model(folder)
    extras = read.extras
    return ExportSource(read.family, read.model, extras.special_tokens, extras.tokenizer_files, extras.card, folder)


def _model_folder(folder: Path) -> ExportSource:
    description = read_model_file(folder)
    family, model = load_model(folder)
    about: dict[str, Any] = description.get("about", {})
    recipe = _recipe_beside(folder)
    files: dict[str, str | bytes] = dict(read_companions(folder))
    special_tokens = SpecialTokens.from_config(description.get("special_tokens", {}))
    if not files and recipe is not None:  # weights saved before runs kept their tokenizer beside them
        files, from_recipe = run_tokenizer(recipe.get("data", {}))
        special_tokens = special_tokens or from_recipe
    source = about.get("source")
    if source and about.get("revision"):
        source = f"{source} (revision {about['revision']})"
    data = recipe.get("data") if recipe else None
    card = ModelCard(
        family=family,
        parameters=parameter_count(model),
        flavor=(recipe or {}).get("model", {}).get("flavor"),
        source=source,
        steps=about.get("steps"),
        tokens=about.get("tokens"),
        data=describe_data(data) if data else None,
        final_loss=about.get("final_loss"),
        recipe=recipe,
        license=about.get("license") or (recipe or {}).get("output", {}).get("license") or _default_license(source),
        base_model=hub_id(about.get("base_model")) or hub_id(about.get("source")),
        datasets=about.get("datasets") or (data_names(data) if data else []),
        task=about.get("task") or (training_kind(recipe) if recipe else None),
        accuracy=about.get("accuracy"),
        accuracy_task=about.get("accuracy_task"),
    )
    return ExportSource(family, model, special_tokens, files, card, folder)


def _default_license(source: str | None) -> str:
    """A trained model's default license; ``unknown`` for weights imported from elsewhere (their own license
    applies, which the card cannot know)."""
    return "unknown" if source else DEFAULT_LICENSE


def _recipe_beside(folder: Path) -> dict[str, Any] | None:
    path = folder / RECIPE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
