"""titanpod.runs: running a recipe to the end: pretraining, SFT and diffusion runs, and rehearsals."""

from titanpod.runs.pretrain import PretrainResult, run_pretraining

__all__ = ["PretrainResult", "run_pretraining"]
