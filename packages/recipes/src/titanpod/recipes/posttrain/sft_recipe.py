"""The typed SFT recipe: one object that decides everything a supervised fine-tuning run does."""

from __future__ import annotations

from dataclasses import dataclass, field

from titanpod.data.sft.config import SFTDataConfig, TaskName, choice
from titanpod.data.tasks import TASKS
from titanpod.kernels import KernelConfig
from titanpod.models.common.args import DecoderArgs
from titanpod.models.field_checks import expand_home
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import get_flavor
from titanpod.recipes.recipe import RunRecipe


@dataclass(frozen=True)
class SFTModelConfig:
    """Which model to fine-tune, and the weights it starts from."""

    family: str = "llama3"
    """Model family, e.g. ``llama3``; a folder in ``init_from`` must hold this family."""
    flavor: str = "debug"
    """Named size within the family, e.g. ``debug``; ignored when ``init_from`` is set (the folder gives the shape)."""
    init_from: str | None = None
    """Start from these weights: a titanpod model folder (model.json + model.safetensors, e.g. ``<run>/model``),
    a Hugging Face folder (config.json + safetensors) or a Hub model id; ``None`` initialises from the seed."""

    def args(self) -> DecoderArgs:
        """The flavor's shape, which a run started from the seed builds; ``KeyError`` names an unknown one."""
        return get_flavor(self.family, self.flavor)

    def __post_init__(self) -> None:
        expand_home(self, "init_from")


@dataclass(frozen=True)
class EvalConfig:
    """Held-out accuracy: greedy completions of a task's test prompts, scored by the task's reward."""

    enabled: bool = True
    """Score held-out accuracy at all."""
    task: TaskName | None = None
    """The task whose test split is scored; ``None``: the training task with ``data.source task``, else none."""
    examples: int = 200
    """Test prompts scored each time."""
    max_new_tokens: int = 16
    """Longest completion generated."""
    before: bool = True
    """Also score the model before training (at the step it starts from)."""
    seed: int = 0
    """Seed of the test prompts drawn (the same every time, so scores compare)."""
    batch_size: int = 64
    """Prompts generated together."""
    show: int = 3
    """Completions printed after the final evaluation."""

    def __post_init__(self) -> None:
        if self.task is not None:
            choice("eval.task", self.task, tuple(TASKS))
        if self.examples < 1 or self.max_new_tokens < 1 or self.batch_size < 1 or self.show < 0:
            raise ValueError(
                "eval.examples, eval.max_new_tokens and eval.batch_size must be at least 1; show 0 or more."
            )


@dataclass(frozen=True)
class SFTRecipe(RunRecipe):
    """A complete, reproducible description of a supervised fine-tuning run."""

    name: str = "custom_sft"
    """Recipe name, used in run directory names."""
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    """The model and its starting weights."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """How it splits over processes (under torchrun); one process ignores it."""
    kernels: KernelConfig = field(default_factory=KernelConfig)
    """Which implementation fills each of the model's op slots (references by default)."""
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """What it fine-tunes on."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out accuracy before and after training."""

    @property
    def eval_task(self) -> str | None:
        """The task scored for accuracy: ``eval.task``, else the training task, else ``None``."""
        if self.eval.task is not None:
            return self.eval.task
        return self.data.task if self.data.source == "task" else None
