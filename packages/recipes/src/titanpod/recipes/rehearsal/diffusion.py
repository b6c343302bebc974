"""``titanpod-diffusion --rehearse``: what a FLUX recipe's rehearsal can honour on this machine today."""

from __future__ import annotations

from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.rehearsal.scaling import RehearsalError


def rehearse_diffusion(recipe: DiffusionRecipe) -> None:
    """Refuse, naming the setting: diffusion training runs in one process, so no parallel plan can be rehearsed.

    A FLUX recipe shards its transformer over every device of its slice (``parallel``); the
    diffusion runner does not shard yet, and a rehearsal never drops a setting, so it stops
    here before any work.
    """
    axes = ", ".join(f"{axis}={getattr(recipe.parallel, axis)}" for axis in ("dp_replicate", "fsdp", "ep", "tp"))
    raise RehearsalError(
        f"parallel ({axes}, over the {recipe.target.chips} chips of the recipe's {recipe.target.chip} slice) cannot "
        "be rehearsed: diffusion training runs in one process and does not shard the FLUX transformer yet. "
        "Nothing was run; the recipe's other settings can be tried one process at a time with --train.steps."
    )
