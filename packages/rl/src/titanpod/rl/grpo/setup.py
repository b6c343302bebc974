"""What a GRPO run loads and checks before it writes anything or starts an engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from titanpod.checkpoint.model_files import MODEL_FILE
from titanpod.checkpoint.pretrained import PretrainedFolder, open_pretrained
from titanpod.data.answers import number_reward
from titanpod.data.sft.records import check_covers
from titanpod.data.sft.tokenizer import TOKENIZER_FILE, SFTTokenizer, load_sft_tokenizer
from titanpod.data.task_files import TaskSource, load_file_task
from titanpod.data.tasks import Example, Task, get_task
from titanpod.data.tokenizer import check_fits
from titanpod.device import Backend, get_backend, process_info
from titanpod.kernels import KernelConfig, model_ops
from titanpod.models import DecoderArgs, Transformer
from titanpod.parallel import DATA_AXES
from titanpod.recipes.families import build_model, decoder_adapters
from titanpod.recipes.posttrain.grpo_recipe import MISSING_INIT_FROM, GRPOConfig, GRPORecipe
from titanpod.rl.grpo.batches import GRPOBatch
from titanpod.rl.grpo.prompts import PromptPlan, PromptShare, prompt_share
from titanpod.rl.grpo.reward_import import check_reward, import_reward
from titanpod.rl.grpo.rewards import AnyReward, Reward
from titanpod.runs.device_fit import check_grpo_fits_device
from titanpod.runs.final_weights import check_export
from titanpod.runs.init_from import place_from_folder
from titanpod.runs.placement import LayoutStart, Placement, start_placement


def open_policy_folder(recipe: GRPORecipe) -> PretrainedFolder:
    """The SFT model folder of ``model.init_from``, described from its small files (nothing large is read).

    ``ValueError`` when ``init_from`` is unset or is not a titanpod model folder (saying how to make one).
    """
    if recipe.model.init_from is None:
        raise ValueError(MISSING_INIT_FROM)
    folder = Path(recipe.model.init_from)
    if not (folder / MODEL_FILE).is_file():
        raise ValueError(
            f"model.init_from {recipe.model.init_from!r} is not a titanpod model folder (no {MODEL_FILE} in it). "
            + MISSING_INIT_FROM.split(". ", 1)[1]
        )
    return open_pretrained(str(folder), decoder_adapters())


def load_tokenizer(recipe: GRPORecipe) -> SFTTokenizer:
    """The SFT run's tokenizer: ``model.tokenizer``, else the one in ``model.init_from``'s folder."""
    spec = recipe.model.tokenizer
    if spec is None:
        folder = Path(str(recipe.model.init_from))
        if not (folder / TOKENIZER_FILE).is_file():
            raise ValueError(
                f"{folder} holds no {TOKENIZER_FILE}; name the tokenizer the SFT run used with --model.tokenizer."
            )
        spec = str(folder)
    return load_sft_tokenizer(spec)


def place_policy(folder: PretrainedFolder, layout: LayoutStart, kernels: KernelConfig) -> tuple[Transformer, Placement]:
    """``folder``'s model in fp32 with ``kernels``' ops, placed (``titanpod.runs.placement``): under torchrun built on
    the meta device and sharded by its family's plan, each rank reading only its own shards from the folder; in one
    process read whole. No rank ever holds the whole fp32 model unless it is the only one."""
    model = build_model(folder.family, folder.args, model_ops(kernels))
    assert isinstance(model, Transformer)
    return model, place_from_folder(model, folder.family, layout, folder, None)


def reference_model(setup: GRPOSetup) -> Transformer | None:
    """The frozen starting model of the KL term (``None`` when ``grpo.kl_beta`` is 0): a second model read from the
    policy's folder and placed as the policy is (under torchrun sharded, its forward a collective). Never a copy of
    the policy's tensors: on the tpu lane a copy may share the device buffers that the optimizer step donates."""
    if setup.recipe.grpo.kl_beta <= 0:
        return None
    reference, _ = place_policy(setup.folder, setup.layout, setup.recipe.kernels)
    return reference.requires_grad_(False).eval()


def load_task(config: GRPOConfig) -> Task:
    """The task ``config`` names: a user's rows (``data_path``, held out by ``eval_path``) or a built-in task."""
    if config.data_path is None:
        return get_task(config.task)
    columns = {"prompt_column": config.prompt_column, "answer_column": config.answer_column}
    train = TaskSource(config.data_path, split=config.data_split, field="grpo.data_path", **columns)
    test = None
    if config.eval_path is not None:
        test = TaskSource(config.eval_path, split=config.eval_split, field="grpo.eval_path", **columns)
    return load_file_task(train, test, numeric=config.reward == "number")


def choose_reward(config: GRPOConfig, task: Task) -> AnyReward:
    """The reward rollouts are scored with: ``reward_function`` (imported and tried on the first training prompt,
    within ``reward_timeout_s``), else the built-in ``reward``."""
    if config.reward_function is not None:
        reward = import_reward(config.reward_function)
        check_reward(reward, task.examples("train", 1, 0)[0], config.reward_timeout_s)
        return reward
    if config.reward == "number":
        return number_reward
    return task.partial_reward if config.reward == "partial" else task.reward


def check_launch(recipe: GRPORecipe, backend: Backend, world_size: int) -> LayoutStart:
    """The checked layout of a GRPO launch (``titanpod.runs.placement``); ``ValueError`` for one GRPO cannot run:
    a single-controller lane (xla), pipeline stages or split sequences (GRPO scores completions with whole rows
    on every rank), kernels the lane cannot run (SDPA where its kernel does not compile: ``Backend.sdpa_problem``)
    or a head loss (GRPO reads logits), or several processes
    with rollouts that are not sampled in each process."""
    layout = start_placement("grpo", recipe.parallel, recipe.train, backend, world_size=world_size)
    if recipe.kernels.head_loss != "reference":
        raise ValueError(
            f"kernels.head_loss {recipe.kernels.head_loss!r} does not apply to GRPO, which reads the policy's logits: "
            "leave it 'reference'."
        )
    if recipe.kernels.attention != "math" and (problem := backend.sdpa_problem()) is not None:
        raise ValueError(
            f"kernels.attention {recipe.kernels.attention!r}: GRPO's built-in engine decodes with PyTorch's SDPA "
            f"unless the attention is 'math', and {problem}. Install what it needs, or pass --kernels.attention math "
            "(plain PyTorch ops, in the updates and in decoding)."
        )
    if world_size > 1 and recipe.rollout.mode != "local":
        raise ValueError(
            f"Under torchrun each GRPO process samples its share of the prompts with its own engine, so "
            f"rollout.mode must be 'local', not {recipe.rollout.mode!r}: start one process for "
            f"--rollout.mode {recipe.rollout.mode}."
        )
    return layout


def data_ranks(recipe: GRPORecipe, world_size: int) -> int:
    """How many data-parallel ranks the launch has (1 in one process); ``PlanError`` for degrees that do not fit."""
    if world_size == 1:
        return 1
    axes = recipe.parallel.mesh_axes(world_size)
    return math.prod(axes[axis] for axis in DATA_AXES)


@dataclass
class GRPOSetup:
    """What a GRPO run has loaded and checked before it writes anything or starts an engine."""

    recipe: GRPORecipe
    """The recipe."""
    backend: Backend
    """The trainer's lane."""
    device: torch.device
    """The trainer's device."""
    family: str
    """The model family of ``model.init_from``."""
    folder: PretrainedFolder
    """The SFT model folder of ``model.init_from``."""
    model: Transformer
    """The policy being trained, in fp32: sharded in place under torchrun, whole in one process."""
    placement: Placement
    """Where the policy lives (``titanpod.runs.placement``)."""
    tokenizer: SFTTokenizer
    """The SFT run's tokenizer."""
    task: Task
    """The task whose train prompts are rolled out."""
    reward: AnyReward
    """The reward function rollouts are scored with."""
    plan: PromptPlan
    """Every step's prompts, each checked to fit the context."""
    eval_task: Task
    """The task held-out accuracy is measured on."""
    test_examples: list[Example]
    """The held-out prompts (none when evaluation is off)."""
    data_ranks: int
    """Data-parallel ranks of the launch (1 in one process)."""
    layout: LayoutStart
    """The launch's checked layout, which places the policy."""


def plan_prompts(recipe: GRPORecipe, task: Task, tokenizer: SFTTokenizer, args: DecoderArgs) -> PromptPlan:
    """Every step's prompts of ``task`` for a policy of shape ``args``, each checked to fit its ``max_seq_len`` with
    ``grpo.max_new_tokens``; ``ValueError`` when the tokenizer does not fit the vocabulary or cannot write the
    task's text, or a prompt is too long."""
    check_fits(tokenizer.tokenizer, tokenizer.spec, args.vocab_size)
    check_covers(tokenizer, task)
    config = recipe.grpo
    return PromptPlan(
        task,
        tokenizer,
        steps=recipe.train.steps,
        prompts_per_step=config.prompts_per_step,
        seed=recipe.train.seed,
        prompt_format=config.format,
        max_new_tokens=config.max_new_tokens,
        max_seq_len=args.max_seq_len,
    )


def prepare_grpo(recipe: GRPORecipe, reward: Reward | None = None) -> GRPOSetup:
    """Check the SFT model folder and its tokenizer, draw and check every step's prompts, then load and place the
    policy (sharded under torchrun: each rank reads only its own shards), before any run directory is written.

    ``ValueError`` names what does not fit: the launch, the lane, the task's file or columns, the reward
    function, ``init_from``, the tokenizer, a prompt, how the prompts split over data ranks and micro-batches.
    ``reward``, when given, replaces the recipe's.
    """
    info = process_info()
    backend = get_backend(recipe.device.lane)
    layout = check_launch(recipe, backend, info.world_size)
    ranks = data_ranks(recipe, info.world_size)
    config = recipe.grpo
    share = prompt_share(config.prompts_per_step, 0, ranks)
    GRPOBatch.check_split((share.stop - share.start) * config.group_size, recipe.train.grad_accum_steps)
    task = load_task(config)
    chosen = reward or choose_reward(config, task)
    device = backend.device(info.local_rank)
    torch.manual_seed(recipe.train.seed)
    folder = open_policy_folder(recipe)
    tokenizer = load_tokenizer(recipe)
    plan = plan_prompts(recipe, task, tokenizer, folder.args)
    eval_task = get_task(recipe.eval.task) if recipe.eval.task is not None else task
    check_covers(tokenizer, eval_task)
    test_examples = eval_task.examples("test", recipe.eval.examples, recipe.eval.seed) if recipe.eval.enabled else []
    check_grpo_fits_device(recipe, folder.family, folder.args, backend, plan.sequence_length)  # before the read
    check_export(folder.family, recipe.kernels, recipe.checkpoint.export_hf)
    model, placement = place_policy(folder, layout, recipe.kernels)  # last: the only large read, after every check
    return GRPOSetup(
        recipe,
        backend,
        device,
        folder.family,
        folder,
        model,
        placement,
        tokenizer,
        task,
        chosen,
        plan,
        eval_task,
        test_examples,
        ranks,
        layout,
    )


def rank_share(setup: GRPOSetup, data_rank: int) -> PromptShare:
    """The block of each step's prompts data rank ``data_rank`` samples and trains on."""
    return prompt_share(setup.recipe.grpo.prompts_per_step, data_rank, setup.data_ranks)
