"""``titanpod-diffusion --rehearse``: what a FLUX recipe's rehearsal can honour on this machine today."""

from __future__ import annotations

from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.rehearsal.scaling import RehearsalError


def rehearse_diffusion(recipe: DiffusionRecipe) -> None:
    """Refuse, naming the setting: the rehearsal scales and launches language-model recipes only.

    A FLUX recipe shards its transformer over every device of its slice (``parallel``), and
    diffusion training does so under torchrun, but the rehearsal has no scaled FLUX recipe and
    launch yet; a rehearsal never drops a setting, so it stops here before any work.
    """
    axes = ", ".join(f"{axis}={getattr(recipe.parallel, axis)}" for axis in ("dp_replicate", "fsdp", "ep", "tp"))
    raise RehearsalError(
        f"parallel ({axes}, over the {recipe.target.chips} chips of the recipe's {recipe.target.chip} slice) cannot "
        "be rehearsed yet: the rehearsal scales and launches language-model recipes only. Nothing was run. Sharded "
        "FLUX training runs under torchrun, e.g. torchrun --nproc-per-node 2 -m titanpod.diffusion.cli --recipe "
        "flux_debug --parallel.fsdp 2; the recipe's other settings can be tried one process at a time with "
        "--train.steps."
    )
