"""The typed GRPO recipe: one object that decides everything a GRPO run does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from titanpod.data.sft.config import FORMATS, PromptFormat, TaskName, choice
from titanpod.data.tasks import TASKS
from titanpod.graph import TrainConfig
from titanpod.kernels import KernelConfig
from titanpod.models.field_checks import expand_home
from titanpod.parallel import ParallelConfig
from titanpod.recipes.posttrain.rollout_config import RolloutConfig
from titanpod.recipes.posttrain.sft_recipe import EvalConfig
from titanpod.recipes.recipe import RunRecipe

MISSING_INIT_FROM = (
    "GRPO starts from a fine-tuned model, and model.init_from is not set. Run SFT first on the same task, e.g. "
    "`uv run titanpod-posttrain --recipe sft_arith --output.run-name sft_arith` for grpo_debug's word problems "
    "(sft_debug for --grpo.task reverse; partly trained, so GRPO has room to gain), then pass its model folder: "
    "`--model.init-from runs/sft_arith/model`."
)


Reward = Literal["exact", "partial", "number"]
"""What ``GRPOConfig.reward`` accepts."""
REWARDS: tuple[str, ...] = get_args(Reward)
"""The built-in rewards (``grpo.reward``)."""


@dataclass(frozen=True)
class GRPOModelConfig:
    """The model GRPO starts from."""

    init_from: str | None = None
    """Required: a titanpod model folder written by an SFT run (``<run>/model``: model.json, model.safetensors
    and the run's tokenizer.json). The family and shape come from the folder."""
    tokenizer: str | None = None
    """``None``: the tokenizer saved in ``init_from``; else ``chars``, a ``tokenizer.json`` path or its folder."""

    def __post_init__(self) -> None:
        expand_home(self, "init_from", "tokenizer")


@dataclass(frozen=True)
class GRPOConfig:
    """Rollouts and the GRPO objective."""

    task: TaskName = "reverse"
    """The built-in task whose train split gives prompts and whose reward scores completions (``reverse``,
    ``add``, ``arith``: multi-step word problems); ``data_path`` replaces it."""
    data_path: str | None = None
    """Your own prompts and reference answers: a ``.jsonl`` or ``.parquet`` file with one row per prompt, or
    ``hub:owner/name`` for a Hugging Face Hub dataset. Replaces ``task``."""
    data_split: str = "train"
    """The split of a ``hub:`` dataset that ``data_path`` names."""
    eval_path: str | None = None
    """Held-out rows for accuracy (a file or ``hub:owner/name``, columns as ``data_path``); ``None``: one in 8
    of ``data_path``'s rows, chosen by a hash of the prompt, is held out and never trained on."""
    eval_split: str = "test"
    """The split of a ``hub:`` dataset that ``eval_path`` names."""
    prompt_column: str = "prompt"
    """The column of ``data_path`` (and ``eval_path``) that holds each prompt."""
    answer_column: str = "answer"
    """The column of ``data_path`` (and ``eval_path``) that holds each reference answer."""
    reward: Reward = "exact"
    """``exact``: 1 for the exact answer, else 0. ``partial``: 1 for the exact answer, else up to 0.5 for the share
    of characters in the right place (a denser signal; accuracy still counts exact answers only). ``number``: 1
    when the last number in the completion equals the reference's (last) number, else 0; accuracy on a
    ``data_path`` task then counts that too."""
    reward_function: str | None = None
    """Your own reward, by import path: ``module:function`` (importable from the current directory or
    PYTHONPATH) or ``file.py:function``, called as ``function(prompt, completion, row)`` with the prompt's whole
    row (a dict of its columns) and returning a number. Replaces ``reward`` for training; accuracy still uses
    ``reward``'s check."""
    reward_timeout_s: float = 30.0
    """How long one call of the reward function may take, in seconds. A call cannot be stopped once started, so
    past this the run stops with an error, keeping what a stopped run keeps, rather than wait for it forever.
    Raise it for a slow remote judge."""
    format: PromptFormat = "plain"
    """How a prompt is laid out (``plain`` or ``chat``), as the SFT run that made the model laid it out."""
    group_size: int = 8
    """Completions sampled per prompt (n); advantages are relative within this group."""
    prompts_per_step: int = 8
    """Prompts per step; a step trains on ``prompts_per_step * group_size`` completions."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts. Every logprob of the objective (sampling, trained and reference) is
    taken from the logits divided by it, so the policy trained is the one that sampled."""
    top_p: float = 1.0
    """Nucleus sampling of the rollouts (1 keeps the whole vocabulary)."""
    max_new_tokens: int = 12
    """Longest completion (the end token, when sampled, counts as one)."""
    clip_eps: float = 0.2
    """PPO clip range of the policy ratio."""
    kl_beta: float = 0.0
    """Weight of the k3 KL penalty to the starting model; 0 disables it and skips the reference model."""
    updates_per_step: int = 1
    """Optimizer updates on each step's rollouts (1: on-policy, the ratio is 1 and nothing clips)."""
    eval_samples: int = 4
    """Completions sampled per held-out prompt (at the rollout temperature and top-p, same seeds before and
    after) for the sampled accuracy reported beside the greedy one; 0 reports greedy accuracy only."""

    def __post_init__(self) -> None:
        expand_home(self, "data_path", "eval_path")
        choice("grpo.task", self.task, tuple(TASKS))
        choice("grpo.format", self.format, FORMATS)
        choice("grpo.reward", self.reward, REWARDS)
        problems = []
        if self.reward_function is not None and ":" not in self.reward_function:
            problems.append(
                f"reward_function {self.reward_function!r} is not an import path: write module:function or "
                "file.py:function"
            )
        if self.eval_path is not None and self.data_path is None:
            problems.append("eval_path holds held-out rows of a data_path task: set data_path too, or drop eval_path")
        if self.group_size < 1 or self.prompts_per_step < 1 or self.max_new_tokens < 1 or self.updates_per_step < 1:
            problems.append("group_size, prompts_per_step, max_new_tokens and updates_per_step must be at least 1")
        if not 0 < self.reward_timeout_s < float("inf"):
            problems.append(f"reward_timeout_s must be a number of seconds above 0, got {self.reward_timeout_s}")
        if self.eval_samples < 0:
            problems.append(f"eval_samples must be >= 0, got {self.eval_samples}")
        if self.temperature <= 0:
            problems.append(f"temperature must be > 0 for exploration, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.clip_eps < 0 or self.kl_beta < 0:
            problems.append(f"clip_eps and kl_beta must be >= 0, got {self.clip_eps} and {self.kl_beta}")
        if problems:
            raise ValueError("grpo: " + "; ".join(problems) + ".")


def grpo_train_config() -> TrainConfig:
    """GRPO's default optimizer and schedule: 40 steps, AdamW at 1e-4 after 10 steps of linear warmup, then
    constant, no weight decay, beta2 0.99, gradient norm clipped to 1, metrics printed every step.

    Warmup matters here: Adam's first updates move every weight by about ``lr`` whatever the gradient's size,
    which on noisy policy gradients undoes the SFT.
    """
    return TrainConfig(
        steps=40, lr=1e-4, warmup_steps=10, decay="constant", weight_decay=0.0, beta2=0.99, grad_clip=1.0, log_every=1
    )


@dataclass(frozen=True)
class GRPORecipe(RunRecipe):
    """A complete, reproducible description of a GRPO run.

    ``train`` counts GRPO steps (rollout, ``grpo.updates_per_step`` optimizer updates, weight sync); its
    schedule gives every update of a step that step's learning rate. ``checkpoint.every`` counts GRPO steps.
    """

    name: str = "custom_grpo"
    """Recipe name, used in run directory names."""
    train: TrainConfig = field(default_factory=grpo_train_config)
    """The optimizer, schedule, step mode and precision of the updates, and the number of GRPO steps."""
    model: GRPOModelConfig = field(default_factory=GRPOModelConfig)
    """The SFT model it starts from."""
    kernels: KernelConfig = field(default_factory=KernelConfig)
    """The policy's attention and expert matmul, in its updates and in the built-in engine's decoding (``math``
    attention decodes with its own plain-op form; other choices decode with SDPA). ``head_loss`` does not apply:
    GRPO reads the policy's logits."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """How the trainer splits over processes under torchrun (each data rank samples its share of the prompts);
    one process ignores it."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """Rollouts and the objective."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Where rollouts are sampled (this process, Ray workers, or a vLLM engine)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out greedy accuracy before and after (``eval.task`` ``None``: the GRPO task)."""
