"""The final weights of a language-model run (pretraining, SFT, GRPO): titanpod's model folder, and with
``checkpoint.export_hf`` a Hugging Face checkpoint beside it. Every runner writes them here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from titanpod.checkpoint import save_hf_checkpoint, save_model
from titanpod.graph import TrainSummary
from titanpod.kernels import KernelConfig
from titanpod.recipes.families import hf_adapter
from titanpod.recipes.posttrain.sft_recipe import SFTRecipe
from titanpod.recipes.recipe import Recipe
from titanpod.runs.hf_export import HFExtras
from titanpod.runs.pipelined import PipelineTensors, whole_model_on_writer
from titanpod.runs.placement import Placement
from titanpod.runs.session import RunSession

MODEL_FOLDER, HF_FOLDER = "model", "hf"
"""Where a run writes its final weights (titanpod's layout) and its Hugging Face export."""


@dataclass(frozen=True)
class FinalWeights:
    """The files a run's final weights went to."""

    weights: Path
    """``<run>/model/model.safetensors``."""
    hf: Path | None
    """``<run>/hf``, when exported (on the rank that wrote it)."""


def write_final_weights(
    placement: Placement,
    family: str,
    run_dir: Path,
    steps: int,
    recipe_json: str,
    extras: HFExtras,
    export_hf: bool,
    say: Callable[[str], None],
    attention_window: int | None = None,
) -> FinalWeights:
    """Write the placed model's weights to ``<run>/model`` with the recipe, the tokenizer and the card's facts;
    with ``export_hf`` also as a Hugging Face checkpoint in ``<run>/hf`` whose config.json states
    ``attention_window`` (the run's ``kernels.window``).

    Every rank calls it: a sharded model is gathered one tensor at a time and rank 0 writes; pipeline stages
    send their tensors to rank 0 in turn, which also gathers the whole model in its host memory for the Hugging
    Face export.
    """
    pipeline = placement.pipeline
    whole = placement.whole if pipeline is not None else placement.model
    assert whole is not None  # a pipeline placement always keeps the model as built
    weights = save_model(
        whole,
        family,
        run_dir / MODEL_FOLDER,
        {"step": steps},
        extra_files={"recipe.json": recipe_json, **extras.tokenizer_files},
        special_tokens=extras.special_tokens,
        about=extras.about,
        source=None if pipeline is None else PipelineTensors(pipeline, whole),  # stage by stage to rank 0
    )
    hf_path = None
    if export_hf:
        exported = whole if pipeline is None else whole_model_on_writer(pipeline, family, whole)
        if exported is not None:
            hf_path = save_hf_checkpoint(
                exported,
                hf_adapter(family),
                run_dir / HF_FOLDER,
                special_tokens=extras.special_tokens,
                extra_files=extras.hf_files(),
                attention_window=attention_window,
            )
            with_tokenizer = " with its tokenizer" if extras.tokenizer_files else ""
            say(f"exported the model{with_tokenizer} as a Hugging Face checkpoint: {hf_path}")
    return FinalWeights(weights, hf_path)


def check_export(family: str, kernels: KernelConfig, export_hf: bool) -> None:
    """Before any work: ``UnsupportedConfigError`` when ``export_hf`` would have to write a model whose attention
    ``family``'s Hugging Face class cannot express (``kernels.window`` where it has no sliding window)."""
    if export_hf:
        hf_adapter(family).window_config(kernels.window)


def write_trained_weights(
    session: RunSession,
    placement: Placement,
    recipe: Recipe | SFTRecipe,
    summary: TrainSummary,
    extras_at: Callable[[float | None], HFExtras],
) -> FinalWeights:
    """``write_final_weights`` for a runner that trained ``placement`` through ``session`` with ``recipe``: into the
    run directory, after ``summary.steps_done`` steps, with what ``extras_at(final_loss)`` gives, the final loss
    being the last report's (as ``metrics.jsonl`` logs it last; ``None`` before any report). Every rank calls it,
    from the writer handed to ``RunSession.save_final_weights``."""
    loss = summary.reports[-1].loss if summary.reports else None
    return write_final_weights(
        placement,
        recipe.model.family,
        session.run_dir,
        summary.steps_done,
        recipe.to_json(),
        extras_at(loss),
        recipe.checkpoint.export_hf,
        session.say,
        recipe.kernels.window,
    )
