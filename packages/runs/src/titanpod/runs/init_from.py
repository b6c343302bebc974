"""``--model.init-from`` for pretraining: the folder of weights a run starts from, checked against the recipe
before anything is built, and the model created from it, sharded or whole."""

from __future__ import annotations

from rich.console import Console

from titanpod.checkpoint.pretrained import PretrainedFolder, open_pretrained
from titanpod.checkpoint.region_reader import RegionReader, read_into_model
from titanpod.device import Backend, process_info
from titanpod.kernels import model_ops
from titanpod.models import Transformer
from titanpod.recipes.families import build_model, decoder_adapters
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
    folder = open_pretrained(recipe.model.init_from, decoder_adapters())
    folder.check_fits(recipe.model.family, recipe.model.args(), SHAPE_FIX)
    return folder


def build_pretrained_model(
    recipe: Recipe, backend: Backend, folder: PretrainedFolder, console: Console | None = None
) -> tuple[Transformer, RegionReader | None]:
    """The recipe's model with ``folder``'s weights, and what to create it from when it is still to be sharded.

    Under torchrun on a lane where each process drives one device, the model stays on the meta device and the
    reader comes back: pass it to the placement as ``initial_values``, which makes each rank's shards
    alone, reading only the slices of the stored tensors they hold. Otherwise (one process, or the xla lane's
    host model) the model is materialised on the backend's parameter device and read whole; the reader is
    ``None``. Names and shapes are checked against the files first; rank 0 prints progress on ``console``.
    """
    say = console.print if console is not None and process_info().is_main else None
    model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
    reader = folder.reader(model, progress=say)
    if say is not None:
        say(f"reading the weights of {folder.describe()}")
    if process_info().world_size > 1 and not backend.single_controller:
        return model, reader
    model.to_empty(device=backend.parameter_device(process_info().local_rank))
    read_into_model(model, reader)
    return model, None
