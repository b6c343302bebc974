"""``--model.init-from`` for pretraining: the folder of weights a run starts from, checked against the recipe
before anything is built, and read into the model once it is sharded."""

from __future__ import annotations

from rich.console import Console
from torch import nn

from titanpod.checkpoint.pretrained import PretrainedFolder, open_pretrained
from titanpod.device import process_info
from titanpod.recipes.recipe import Recipe

SHAPE_FIX = (
    "Choose the flavor the weights were made from with --model.flavor, or give the folder's sizes with "
    "--model.shape.<field> (e.g. --model.shape.n-layers)."
)


def pretrained_for(recipe: Recipe) -> PretrainedFolder | None:
    """The folder ``model.init_from`` names (``None`` when unset), after checking that it holds the recipe's
    family and shape: ``ValueError`` names every field that differs, ``FileNotFoundError`` a folder that is
    not a model. Reads only the folder's small files."""
    if recipe.model.init_from is None:
        return None
    folder = open_pretrained(recipe.model.init_from)
    folder.check_fits(recipe.model.family, recipe.model.args(), SHAPE_FIX)
    return folder


def load_pretrained(model: nn.Module, folder: PretrainedFolder, console: Console | None = None) -> None:
    """Fill ``model`` (whole, or sharded with ``DTensor`` parameters) from ``folder``, each process reading only
    the slices of the tensors it holds; rank 0 prints progress on ``console``."""
    say = console.print if console is not None and process_info().is_main else None
    if say is not None:
        say(f"reading the weights of {folder.source} ({folder.kind} folder, {len(folder.files.files)} files)")
    folder.load_into(model, say)
