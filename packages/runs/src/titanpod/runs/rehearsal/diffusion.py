"""``titanpod-diffusion --rehearse``: a FLUX recipe run on this machine with every setting it makes, small, checked.

The recipe is scaled by ``titanpod.recipes.rehearsal.diffusion``; its image folder and pipeline folder (a tiny
random autoencoder and text encoders in the published layout) are written into the rehearsal's folder; then
each lane runs it three times (uninterrupted, stopped at ``STOP_AT``, resumed) exactly as the language-model
rehearsal does, with the diffusion runner.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from titanpod.device import backend_class
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.rehearsal.diffusion import (
    DiffusionMaterials,
    check_diffusion_honourable,
    scale_diffusion_recipe,
)
from titanpod.recipes.rehearsal.flux_materials import write_image_folder, write_pipeline_folder
from titanpod.recipes.rehearsal.scaling import RehearsalError, rehearsal_lanes
from titanpod.runs.diffusion.run import check_block_recompute
from titanpod.runs.rehearsal.rehearse import RehearsalReport, run_rehearsal


def rehearse_diffusion(
    recipe: DiffusionRecipe, folder: Path, console: Console, lanes: tuple[str, ...] | None = None
) -> RehearsalReport:
    """Rehearse FLUX ``recipe`` in ``folder`` on ``lanes`` (default: ``rehearsal_lanes``) and print what happened.

    ``RehearsalError`` (before anything runs or is written) names a setting this machine cannot honour.
    """
    lanes = lanes or rehearsal_lanes(recipe)  # type: ignore[arg-type]  # reads device.lane and parallel.pp
    check_diffusion_honourable(recipe, lanes)
    folder = folder.resolve()  # the runs start in this folder: a path relative to ours would not be found there
    materials = DiffusionMaterials.under(folder)
    scaled = {lane: scale_diffusion_recipe(recipe, lane, folder / lane, materials) for lane in lanes}
    for lane, (run, _) in scaled.items():
        try:
            check_block_recompute(run, backend_class(lane).single_controller)
        except ValueError as error:
            raise RehearsalError(f"on the {lane} lane: {error}") from error
    folder.mkdir(parents=True, exist_ok=True)
    first = next(iter(scaled.values()))[0]
    if first.data.source == "imagefolder":
        write_image_folder(materials.images, first.data.resolution, first.train.seed)
    if first.model.autoencoder != "pixels" or first.model.text_encoders != "random":
        args = first.model.args()  # the same widths on every lane
        write_pipeline_folder(materials.pipeline, args.context_dim, args.pooled_dim, first.train.seed)
    return run_rehearsal(recipe.name, scaled, folder, console, runner="diffusion")
