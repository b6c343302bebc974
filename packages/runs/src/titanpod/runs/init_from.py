"""``--model.init-from``: the folder of weights a run starts from, checked against the recipe before anything is
built, the recipe made to follow it (its family, shape and tokenizer are the folder's), and the model created from
it, sharded or whole."""

from __future__ import annotations

import dataclasses
from typing import Protocol, TypeVar

from rich.console import Console

from titanpod.checkpoint.pretrained import PretrainedFolder, open_pretrained
from titanpod.checkpoint.region_reader import RegionReader, read_into_model
from titanpod.device import Backend, process_info
from titanpod.kernels import model_ops
from titanpod.models import DecoderArgs, RegionValues, Transformer
from titanpod.recipes.families import build_model, decoder_adapters
from titanpod.recipes.recipe import Recipe
from titanpod.runs.placement import LayoutStart, Placement


class _Model(Protocol):
    family: str
    init_from: str | None


class _Data(Protocol):
    tokenizer: str | None


class StartingRecipe(Protocol):
    """What following a folder needs of a recipe kind (pretraining, SFT): its model and data sections."""

    @property
    def model(self) -> _Model: ...

    @property
    def data(self) -> _Data: ...


R = TypeVar("R", bound=StartingRecipe)


def opened_init_from(init_from: str, console: Console | None = None) -> PretrainedFolder:
    """``model.init_from`` opened (``open_pretrained``), a GGUF file's conversion said on rank 0's ``console``."""
    say = console.print if console is not None and process_info().is_main else None
    return open_pretrained(init_from, decoder_adapters(), progress=say)


def pretrained_for(recipe: Recipe, console: Console | None = None) -> PretrainedFolder | None:
    """The folder ``model.init_from`` names (``None`` when unset), after checking that the sizes the recipe gives
    on purpose (``model.shape``) are the folder's: ``ValueError`` names every one that differs,
    ``FileNotFoundError`` a folder that is not a model. Reads only the folder's small files (a GGUF file is
    converted into a folder first, once)."""
    if recipe.model.init_from is None:
        return None
    folder = opened_init_from(recipe.model.init_from, console)
    recipe.model.checkpoint_args(folder.args)
    return folder


def model_args(recipe: Recipe, folder: PretrainedFolder | None) -> DecoderArgs:
    """The shape of the model the run trains: the folder's (with ``model.shape.max_seq_len`` and
    ``model.capacity_factor`` applied) when it starts from one, else the recipe's flavor and shape."""
    return recipe.model.args() if folder is None else recipe.model.checkpoint_args(folder.args)


def following(recipe: R, folder: PretrainedFolder | None, default_tokenizer: str) -> R:
    """``recipe`` as the run records it: with ``folder``, its family is the folder's; ``data.tokenizer`` left
    ``None`` becomes the folder (when it holds a tokenizer, so its chat template and special tokens go along), else
    ``default_tokenizer`` (``builtin`` for pretraining, ``chars`` for SFT). A tokenizer the recipe names stays."""
    model, data = recipe.model, recipe.data
    if folder is not None:
        model = dataclasses.replace(model, family=folder.family)  # type: ignore[type-var]
    if data.tokenizer is None:
        own = folder.tokenizer_folder if folder is not None else None
        data = dataclasses.replace(data, tokenizer=str(own) if own is not None else default_tokenizer)  # type: ignore[type-var]
    return dataclasses.replace(recipe, model=model, data=data)  # type: ignore[type-var]


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
    model = build_model(folder.family, model_args(recipe, folder), model_ops(recipe.kernels))
    reader = folder.reader(model, progress=say)
    if say is not None:
        say(f"reading the weights of {folder.describe()}")
    if process_info().world_size > 1 and not backend.single_controller:
        return model, reader
    model.to_empty(device=backend.parameter_device(process_info().local_rank))
    read_into_model(model, reader)
    return model, None


def place_from_folder(
    model: Transformer,
    family: str,
    layout: LayoutStart,
    pretrained: PretrainedFolder | None,
    console: Console | None,
    seeded: RegionValues | None = None,
) -> Placement:
    """Place ``model`` (on the meta device; ``titanpod.runs.placement``) by ``family``'s plan and create its
    parameters from ``pretrained`` (in fp32), or else from ``seeded`` (a meta model's region init): under torchrun
    each rank makes and reads only its own shard of each parameter, so no rank holds the whole model; one process
    reads the folder whole. Names and shapes are checked first; rank 0 prints progress on ``console``."""
    say = console.print if console is not None and process_info().is_main else None
    reader = seeded if pretrained is None else pretrained.reader(model, progress=say)
    if say is not None and pretrained is not None:
        say(f"reading the weights of {pretrained.describe()}")
    if layout.world_size == 1 and pretrained is not None:  # one process reads the folder whole
        model.to_empty(device=layout.backend.parameter_device(process_info().local_rank))
        read_into_model(model, reader)  # type: ignore[arg-type]
        reader = None
    return layout.place(model, family, reader)
