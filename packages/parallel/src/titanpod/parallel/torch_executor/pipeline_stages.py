"""A decoder ``Transformer`` cut by layer into pipeline stages that keep the full model's parameter names.

Legend: B batch, S sequence, M model dim.

Stage s of n holds layers ``s * L/n .. (s+1) * L/n - 1`` of the model's L; the first stage also holds
``tok_embeddings``, the last ``norm`` and ``output``. A stage's parameters are named as in the whole
model (``layers.5.attention.wq.weight`` stays so on whichever stage holds layer 5), so a checkpoint
written by a pipeline has the keys of one written without, and loads at any other pp degree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from titanpod.parallel.config import ParallelConfig
from titanpod.parallel.errors import PlanError

SCHEDULES = ("1f1b", "interleaved_1f1b")
"""The pipeline schedules ``ParallelConfig.pp_schedule`` may name."""


@dataclass(frozen=True)
class PipelineLayout:
    """How the stages of a pipeline are laid out over its ranks."""

    pp: int
    """Pipeline ranks."""
    stages_per_rank: int
    """Stages each rank holds (1 for ``1f1b``)."""
    schedule: str
    """``ParallelConfig.pp_schedule``."""
    microbatches: int
    """Micro-batches per step."""

    @property
    def n_stages(self) -> int:
        """Stages in the whole pipeline."""
        return self.pp * self.stages_per_rank

    def stages_of(self, pp_rank: int) -> list[int]:
        """The stages pipeline rank ``pp_rank`` holds, round-robin: ``pp_rank``, ``pp_rank + pp``, ..."""
        return [pp_rank + k * self.pp for k in range(self.stages_per_rank)]

    def layers_of(self, stage: int, n_layers: int) -> range:
        """The layer indices stage ``stage`` holds out of ``n_layers``."""
        per_stage = n_layers // self.n_stages
        return range(stage * per_stage, (stage + 1) * per_stage)


def pipeline_layout(config: ParallelConfig, grad_accum_steps: int) -> PipelineLayout:
    """The layout ``config`` asks for, with ``grad_accum_steps`` micro-batches a step (``train.grad_accum_steps``).

    ``PlanError`` naming the field and the fix for an unknown schedule, a stage count the schedule cannot
    take, or micro-batches that disagree with the step's or that the schedule cannot run.
    """
    if config.pp_schedule not in SCHEDULES:
        raise PlanError(f"parallel.pp_schedule={config.pp_schedule!r} is not one of {', '.join(SCHEDULES)}.")
    if config.cp > 1:
        raise PlanError(
            f"parallel.pp={config.pp} with parallel.cp={config.cp} is not supported: pipeline stages run every "
            "row whole (their RoPE positions and loss are not cut into context-parallel chunks); "
            "set cp to 1 or pp to 1."
        )
    interleaved = config.pp_schedule == "interleaved_1f1b"
    per_rank = config.pp_stages_per_rank or (2 if interleaved else 1)
    if not interleaved and per_rank != 1:
        raise PlanError(
            f"parallel.pp_stages_per_rank={per_rank} needs parallel.pp_schedule='interleaved_1f1b'; "
            "1f1b runs one stage per rank (set pp_stages_per_rank to 0 or 1)."
        )
    if interleaved and per_rank < 2:
        raise PlanError(
            f"parallel.pp_schedule='interleaved_1f1b' needs 2 or more stages per rank, got "
            f"parallel.pp_stages_per_rank={per_rank}; set it to 0 (which picks 2) or more, or use pp_schedule='1f1b'."
        )
    microbatches = config.pp_microbatches or grad_accum_steps
    if microbatches != grad_accum_steps:
        raise PlanError(
            f"parallel.pp_microbatches={config.pp_microbatches} but train.grad_accum_steps={grad_accum_steps}: "
            "a step's micro-batches are the pipeline's; set them equal "
            "(or pp_microbatches to 0 to follow grad_accum_steps)."
        )
    pp = config.pp
    if microbatches < pp or (interleaved and microbatches % pp):
        need = f"a multiple of pp={pp}" if interleaved else f"at least pp={pp}"
        raise PlanError(
            f"{microbatches} micro-batches a step cannot fill the {config.pp_schedule} pipeline of pp={pp}: it needs "
            f"{need}. Set train.grad_accum_steps (and parallel.pp_microbatches) to {pp}, or a larger such number."
        )
    return PipelineLayout(pp, per_rank, config.pp_schedule, microbatches)


def check_pipelinable(model: nn.Module, layout: PipelineLayout) -> None:
    """``PlanError`` naming the fix unless ``model`` is a dense, untied decoder whose layers divide into the stages."""
    args = getattr(model, "args", None)
    layers = getattr(model, "layers", None)
    if args is None or not isinstance(layers, nn.ModuleList) or not hasattr(type(model), "rotary_tables"):
        raise PlanError(
            f"Pipeline parallelism cuts a decoder Transformer (tok_embeddings, layers, norm, output); "
            f"{type(model).__name__} is not one. Use parallel.pp=1 for this model."
        )
    if getattr(args, "moe", None) is not None:
        raise PlanError(
            "Pipeline parallelism of mixture-of-experts models is not supported (their load-balancing loss spans "
            "every stage); use parallel.pp=1 and ep/fsdp for this model."
        )
    if getattr(args, "tie_embeddings", False):
        raise PlanError(
            "Pipeline parallelism of a model with tied embeddings is not supported (the first and last stages would "
            "share the embedding table); use parallel.pp=1, or a flavor with tie_embeddings=False."
        )
    if len(layers) % layout.n_stages:
        raise PlanError(
            f"The model's {len(layers)} layers do not divide into {layout.n_stages} pipeline stages "
            f"(pp={layout.pp} x {layout.stages_per_rank} per rank); choose parallel.pp (and pp_stages_per_rank) "
            f"whose product divides {len(layers)}."
        )


class DecoderStage(nn.Module):
    """One pipeline stage of a decoder: its run of layers, with the embedding first and the norm and head last.

    ``forward`` takes tokens [B, S] on the first stage and the residual stream [B, S', M] on the others
    (S' = S / ``sequence_split`` when tensor-parallel ranks split the sequence between regions); it gives
    the residual stream, or on the last stage the final-norm hidden states [B, S, M], which ``loss`` turns
    into the model's loss through the head.
    """

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool, index: int, n_stages: int) -> None:
        super().__init__()
        self.args = model.args
        self.ops = model.ops
        self._rotary_tables = type(model).rotary_tables  # a function of the class: holds no reference to ``model``
        self.index = index
        """This stage's place in the pipeline."""
        self.n_stages = n_stages
        """Stages in the pipeline."""
        self.sequence_split = 1
        """How many ways the residual stream's sequence is split between layers (tp with sequence parallelism)."""
        self.recompute = False
        """Recompute each layer's activations in the backward instead of keeping them (``pp_recompute``)."""
        self.activation_dtype = torch.float32
        """The dtype of the residual stream passed between stages: the dtype parameters are computed in
        (``ParallelConfig.param_dtype``; the embedding gives it, and autocast's adds keep it)."""
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layers})
        self.norm = model.norm if last else None
        self.output = model.output if last else None

    def forward(self, x: torch.Tensor, document_ids_BS: torch.Tensor | None = None) -> torch.Tensor:
        """This stage's layers over ``x`` (tokens on the first stage), attention kept within ``document_ids_BS``."""
        h_BSM = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        seq_len = x.shape[1] if self.tok_embeddings is not None else x.shape[1] * self.sequence_split
        positions_S = torch.arange(seq_len, device=x.device)
        cos_SD, sin_SD = self._rotary_tables(self.args, positions_S, h_BSM.dtype)
        for layer in self.layers.values():
            if self.recompute:
                h_BSM, _ = checkpoint(layer, h_BSM, cos_SD, sin_SD, document_ids_BS, use_reentrant=False)
            else:
                h_BSM, _ = layer(h_BSM, cos_SD, sin_SD, document_ids_BS)
        return self.norm(h_BSM) if self.norm is not None else h_BSM

    def loss(self, h_BSM: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        """The last stage's loss: the head and mean cross-entropy over ``labels_BS`` (the model's ``head_loss``)."""
        if self.output is None:
            raise RuntimeError(f"Stage {self.index} of {self.n_stages} has no head: only the last stage has a loss.")
        return self.ops.head_loss(h_BSM, self.output.weight, labels_BS)


class RankStages(nn.Module):
    """Every parameter one pipeline rank holds (all its stages), under the whole model's names.

    It shares its modules with the rank's ``DecoderStage``s and has no forward: it is what the rank's
    optimizer steps and its checkpoints save and load (``named_parameters``, ``state_dict``).
    """

    def __init__(self, stages: list[DecoderStage]) -> None:
        super().__init__()
        self.args = stages[0].args
        self.tok_embeddings = next((s.tok_embeddings for s in stages if s.tok_embeddings is not None), None)
        self.layers = nn.ModuleDict({name: layer for stage in stages for name, layer in stage.layers.items()})
        self.norm = next((s.norm for s in stages if s.norm is not None), None)
        self.output = next((s.output for s in stages if s.output is not None), None)


def cut_stages(model: nn.Module, layout: PipelineLayout, pp_rank: int) -> list[DecoderStage]:
    """The stages of ``model`` pipeline rank ``pp_rank`` holds (checked by ``check_pipelinable``), in order.

    The stages share ``model``'s modules (on the meta device or materialised, as the model is); the layers
    other ranks hold are left to ``model`` alone, so drop it once every rank has cut its stages.
    """
    check_pipelinable(model, layout)
    n_layers = len(model.layers)
    return [
        DecoderStage(
            model,
            layout.layers_of(stage, n_layers),
            first=stage == 0,
            last=stage == layout.n_stages - 1,
            index=stage,
            n_stages=layout.n_stages,
        )
        for stage in layout.stages_of(pp_rank)
    ]
