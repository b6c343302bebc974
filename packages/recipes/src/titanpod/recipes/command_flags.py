"""The flags the apps' commands share, as frozen dataclasses an app's command inherits.

A dataclass takes its fields base by base from the last base to the first, so an app lists its bases in the
reverse of the order its flags are shown: ``class Command(SliceFlags, ResumeFlag, RecipeCommand[Recipe])``
shows the recipe flags, then ``--resume``, then the slice flags. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Generic, Literal, TypeVar

import tyro

RecipeT = TypeVar("RecipeT")
TargetedRecipe = TypeVar("TargetedRecipe")


@dataclasses.dataclass(frozen=True)
class RecipeCommand(Generic[RecipeT]):
    """What every app's command line asks for first: a recipe, where it came from, and whether to list the named
    recipes or print this one instead of running it."""

    recipe: Annotated[RecipeT, tyro.conf.arg(name="")]
    """The recipe with every override applied."""
    recipe_name: Annotated[str, tyro.conf.arg(name="recipe")]
    """A recipe name (see --list-recipes), or a recipe file: a run's recipe.json, or a TOML file with
    ``base = "NAME"`` and the fields that differ. It gives every other flag its default."""
    list_recipes: tyro.conf.FlagCreatePairsOff[bool] = False
    """List the named recipes and exit."""
    print_recipe: tyro.conf.FlagCreatePairsOff[bool] = False
    """Print the resolved recipe as JSON (a recipe file --recipe reads back) and exit without running."""


@dataclasses.dataclass(frozen=True)
class ResumeFlag:
    """``--resume``: continue a run instead of starting one."""

    resume: Annotated[str | None, tyro.conf.arg(metavar="[NAME]")] = None
    """Continue a run from its newest checkpoint: --resume NAME, the run directory NAME under --output.runs-dir
    (or the run started as --output.run-name NAME); --resume alone, --output.run-name or else the newest run of
    the recipe that has a checkpoint."""


@dataclasses.dataclass(frozen=True)
class SliceFlags:
    """Planning, rehearsing or compiling a recipe for a slice instead of training it, and the slice's chips.

    An app redeclares ``compile_for`` and ``compile_layers`` to give its own examples in their help; a field
    redeclared keeps its place among the flags.
    """

    dry_run: tyro.conf.FlagCreatePairsOff[bool] = False
    """Plan on the recipe's target slice instead of training: memory per device and step time."""
    rehearse: tyro.conf.FlagCreatePairsOff[bool] = False
    """Run the recipe on this machine at a small size with every setting it makes, and check it resumes exactly."""
    rehearse_lanes: tuple[Literal["cpu", "xla"], ...] | None = None
    """Lanes to rehearse on; ``None``: the recipe's, or both for a TPU recipe."""
    compile_for: str | None = None
    """Compile the whole training step for a TPU slice (``target``: the recipe's own) with libtpu on this host,
    without TPUs or weights, and report memory a chip, flops, the compiler's estimated step time and the
    collectives."""
    compile_layers: tuple[int, ...] = ()
    """With --compile-for: compile the model cut to this depth; two depths compile both and extrapolate the whole
    model's figures by depth."""
    compile_output: Path | None = None
    """With --compile-for: the folder for report.json (default ``<runs_dir>/compile-<recipe>-<slice>``)."""
    compile_keep_program: tyro.conf.FlagCreatePairsOff[bool] = False
    """With --compile-for: also keep the optimised HLO and the serialised executable in that folder."""
    chip: str | None = None
    """Short for --target.chip: the chip kind --dry-run plans for (``v5p``, ``v6e``, ``h100`` ...)."""
    chips: int | None = None
    """Short for --target.chips: the chips in the slice --dry-run plans for."""

    def with_target_chips(self, recipe: TargetedRecipe) -> TargetedRecipe:
        """``recipe`` (a dataclass with a ``target`` section) with --chip and --chips written into its target,
        where given."""
        if self.chip is None and self.chips is None:
            return recipe
        target = recipe.target  # type: ignore[attr-defined]
        chip = target.chip if self.chip is None else self.chip
        chips = target.chips if self.chips is None else self.chips
        return dataclasses.replace(recipe, target=dataclasses.replace(target, chip=chip, chips=chips))  # type: ignore[type-var]
