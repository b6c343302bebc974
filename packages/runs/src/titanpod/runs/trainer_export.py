"""A trained model read back from a trainer checkpoint (``<run>/checkpoints/step-NNNNNN``), with what is known of
its training, so ``titanpod-convert export`` can write any checkpoint a run saved as a Hugging Face folder.

The model's shape comes from the recipe in ``trainer.json`` (the folder ``model.init_from`` named, when the recipe
gives no shape of its own); the weights from the checkpoint's ``state/`` (parameters only, strictly checked).
The final loss is the one ``<run>/metrics.jsonl`` records at the checkpoint's step, when the run directory
holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.checkpoint.trainer_weights import load_trainer_weights, read_trainer_checkpoint, trainer_weights_dtype
from titanpod.graph.metrics_rows import read_rows
from titanpod.models import DecoderArgs, Transformer, parameter_count
from titanpod.recipes.families import build_model, decoder_adapters, get_flavor
from titanpod.recipes.recipe import ModelConfig, dataclass_from_dict
from titanpod.runs.hf_export import HFExtras, training_extras

METRICS_FILE = "metrics.jsonl"
"""The run directory's per-step metrics."""


@dataclass(frozen=True)
class TrainerModel:
    """A model read from a trainer checkpoint, and the extras its Hugging Face folder gets."""

    family: str
    """titanpod model family."""
    model: Transformer
    """The model, on the CPU, in the dtype its parameters were saved in."""
    extras: HFExtras
    """Tokenizer, special ids and model card."""


def recipe_model_args(model: dict[str, Any]) -> tuple[str, DecoderArgs]:
    """The family and shape a recipe's ``model`` section builds: with ``init_from``, the folder's shape (and the
    sizes a pretraining recipe changes on purpose, ``ModelConfig.checkpoint_args``), else the flavor's."""
    family = str(model["family"])
    if model.get("init_from"):
        found = open_pretrained(str(model["init_from"]), decoder_adapters()).args
        if "shape" in model:
            return family, dataclass_from_dict(ModelConfig, model, "recipe.model").checkpoint_args(found)
        return family, found
    if "shape" in model:
        return family, dataclass_from_dict(ModelConfig, model, "recipe.model").args()
    return family, get_flavor(family, str(model["flavor"]))


def loss_at(run_dir: Path, step: int) -> float | None:
    """The training loss ``<run_dir>/metrics.jsonl`` records at ``step`` (``None`` when it records none)."""
    loss = None
    for record in read_rows(Path(run_dir) / METRICS_FILE):
        if record.get("step") == step and isinstance(record.get("loss"), float):
            loss = record["loss"]
    return loss


def read_trainer_model(folder: Path | str) -> TrainerModel:
    """The model a trainer checkpoint holds, with its recipe's tokenizer and a model card."""
    folder = Path(folder)
    trainer = read_trainer_checkpoint(folder)
    recipe = trainer["recipe"]
    if "model" not in recipe or "family" not in recipe.get("model", {}):
        raise ValueError(f"The recipe in {folder}/trainer.json names no model family; it is not a language model's.")
    family, args = recipe_model_args(recipe["model"])
    model = build_model(family, args)
    model.to(trainer_weights_dtype(folder))
    model.to_empty(device="cpu")
    load_trainer_weights(model, folder)
    step = int(trainer["step"])
    extras = training_extras(
        recipe,
        family,
        parameter_count(model),
        step,
        final_loss=loss_at(folder.parent.parent, step),
        notes=[f"Exported from the trainer checkpoint `{folder.name}` (step {step})."],
    )
    return TrainerModel(family, model, extras)
