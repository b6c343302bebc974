"""A GRPO run from a ``GRPORecipe``: rollouts from an engine that holds its own copy of the weights, the
clipped group-relative objective, and a verified weight sync into the engine after every step.

The trainer is this process. The engine is a ``BuiltinEngine`` in this process (``rollout.mode``
``local``, the default) or ``RayRollout``'s workers, each in its own Ray actor process (``ray``).

Each step: draw ``prompts_per_step`` prompts from the task's train split (seeded by step), sample
``group_size`` completions of each (completions stop at the end token; seeds depend only on the step,
prompt and sample, so both modes draw the same completions), score them with the task's reward (a
reward that raises is logged and the sample skipped and counted, never scored 0), turn rewards into
group-relative advantages, recompute the completion tokens' logprobs under the trainer model (one
full forward of prompt + completion), take ``updates_per_step`` AdamW steps on the clipped loss
(+ ``kl_beta`` x the k3 KL to the frozen starting model), and sync the weights into the engine as
version ``step``; the sync fails unless the engine's checksum equals the trainer's.

The run directory holds recipe.json, tokenizer.json (+ tokenizer_config.json), metrics.jsonl (one
line per step), eval.json (held-out greedy accuracy before and after), model/ (titanpod weights with
the tokenizer, loadable as the next run's ``--model.init-from``) and, with ``export_hf``, hf/.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape

from titanpod.checkpoint import load_model, save_hf_checkpoint, save_model
from titanpod.checkpoint.model_files import MODEL_FILE
from titanpod.data.sft.batches import check_covers, prompt_text
from titanpod.data.sft.tokenizer import TOKENIZER_FILE, SFTTokenizer, load_sft_tokenizer
from titanpod.data.tasks import Example, Task, get_task
from titanpod.data.tokenizer import check_fits
from titanpod.device import get_backend, process_info
from titanpod.graph import JsonlWriter
from titanpod.models import Transformer, parameter_count
from titanpod.recipes.posttrain.grpo_recipe import MISSING_INIT_FROM, GRPORecipe, GRPOTrainConfig
from titanpod.rl.grpo_loss import clipped_policy_loss, group_advantages, kl_penalty
from titanpod.rl.rollout import Completion, RolloutEngine, SamplingParams, sync_weights
from titanpod.rl.rollout.engines import close_rollout, open_rollout
from titanpod.rl.rollout.ray_rollout import RayRollout
from titanpod.runs.evaluation import Evaluation, evaluate
from titanpod.runs.pretrain import prepare_run_dir
from titanpod.runs.sft import EVAL_FILE, HF_FOLDER, MODEL_FOLDER, Score, score_of, write_eval_file

Reward = Callable[[str, str, str], float]
"""A reward function: (prompt, completion text, answer) -> reward."""
SHOWN_REWARD_ERRORS = 5
"""Reward errors printed in full; later ones are only counted."""


@dataclass
class GRPOResult:
    """What a finished GRPO run leaves behind."""

    run_dir: Path
    """The run directory (see the module docstring)."""
    lane: str
    """The lane the run used."""
    parameters: int
    """Parameter count of the model."""
    started_from: str
    """The SFT model folder it started from."""
    rollout: str = "local"
    """Where rollouts were sampled: ``local`` or the Ray workers."""
    steps_done: int = 0
    """GRPO steps completed."""
    interrupted: bool = False
    """Stopped by Ctrl-C."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Every step's metrics (as written to metrics.jsonl)."""
    eval_task: str | None = None
    """The task scored."""
    eval_examples: int = 0
    """Test prompts scored."""
    before: Score | None = None
    """Held-out accuracy before GRPO."""
    after: Score | None = None
    """Held-out accuracy after GRPO."""
    sampled_before: float | None = None
    """Held-out accuracy of sampled completions (``grpo.eval_samples`` per prompt) before GRPO."""
    sampled_after: float | None = None
    """The same after GRPO (same prompts, same seeds)."""
    skipped_samples: int = 0
    """Completions whose reward function raised (left out of the update)."""
    weights_version: int = 0
    """The engine's weights version at the end (the last synced step)."""
    checksum: str = ""
    """The engine's weights checksum at the end (equal to the trainer's)."""
    wall_seconds: float = 0.0
    """Wall time of the GRPO steps (evaluation and saving excluded)."""
    weights_path: Path | None = None
    """``<run>/model/model.safetensors``, if saved."""
    hf_path: Path | None = None
    """``<run>/hf``, if exported."""

    @property
    def exit_code(self) -> int:
        """0 when the run finished, 130 when interrupted."""
        return 130 if self.interrupted else 0

    def summary_rows(self) -> list[tuple[str, str]]:
        """The run's summary as (label, value) rows."""
        rows = [
            ("lane", self.lane),
            ("parameters", f"{self.parameters:,}"),
            ("started from", self.started_from),
            ("rollouts", self.rollout),
            ("steps", f"{self.steps_done}" + (" (interrupted)" if self.interrupted else "")),
        ]
        if self.history:
            window = min(5, len(self.history))
            for label, part in (("first", self.history[:window]), ("last", self.history[-window:])):
                reward = sum(row["reward_mean"] for row in part) / window
                rows.append((f"mean reward, {label} {window} steps", f"{reward:.3f}"))
        rows.append(("samples skipped (reward raised)", str(self.skipped_samples)))
        for label, score in (("before", self.before), ("after", self.after)):
            if score is not None:
                rows.append(score.summary_row(label, self.eval_examples, self.eval_task))
        for label, sampled in (("before", self.sampled_before), ("after", self.sampled_after)):
            if sampled is not None:
                rows.append((f"held-out accuracy {label}, sampled", f"{sampled:.1%}"))
        rows.append(("engine weights", f"version {self.weights_version}, checksum {self.checksum[:16]}"))
        rows.append(("wall time (steps)", f"{self.wall_seconds:.1f} s"))
        rows.append(("run directory", str(self.run_dir)))
        rows.append(("weights", str(self.weights_path or "not saved")))
        if self.hf_path is not None:
            rows.append(("Hugging Face export", str(self.hf_path)))
        return rows


def load_policy(recipe: GRPORecipe, device: torch.device) -> tuple[str, Transformer, SFTTokenizer]:
    """The SFT model of ``model.init_from`` (fp32, on ``device``), its family and its tokenizer.

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
    spec = recipe.model.tokenizer
    if spec is None:
        if not (folder / TOKENIZER_FILE).is_file():
            raise ValueError(
                f"{folder} holds no {TOKENIZER_FILE}; name the tokenizer the SFT run used with --model.tokenizer."
            )
        spec = str(folder)
    family, model = load_model(folder, "cpu")
    model = model.float().to(device)
    return family, model, load_sft_tokenizer(spec)


def sampled_accuracy(
    engine: RolloutEngine, tokenizer: SFTTokenizer, task: Task, examples: list[Example], recipe: GRPORecipe
) -> float:
    """The share of ``grpo.eval_samples`` completions per example, sampled by ``engine`` at the rollout
    temperature and top-p with seeds from ``eval.seed`` (the same draws before and after), that ``task``
    scores 1.0."""
    config = recipe.grpo
    prompts = tokenizer.encode_batch([prompt_text(tokenizer, e.prompt, config.format) for e in examples])
    params = SamplingParams(
        max_new_tokens=recipe.eval.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        stop_token_ids=tokenizer.stop_ids,
        seed=recipe.eval.seed,
        n=config.eval_samples,
    )
    completions = engine.generate(prompts, params)
    right = 0
    for completion in completions:
        example = examples[completion.prompt_index]
        right += task.reward(example.prompt, tokenizer.decode(completion.token_ids), example.answer) == 1.0
    return right / len(completions)


def warmup_lr(train: GRPOTrainConfig, step: int) -> float:
    """The learning rate of GRPO step ``step`` (1-based): linear warmup over ``warmup_steps``, then ``lr``."""
    if step <= train.warmup_steps:
        return train.lr * step / train.warmup_steps
    return train.lr


def step_examples(task: Task, recipe: GRPORecipe, step: int) -> list[Example]:
    """The train prompts of ``step`` (1-based): the same for the same seed and step."""
    return task.examples("train", recipe.grpo.prompts_per_step, recipe.train.seed * 100_003 + step)


def check_prompt_fits(prompt: str, ids: list[int], max_new_tokens: int, max_seq_len: int, where: str) -> None:
    """``ValueError`` when a prompt plus its longest completion does not fit the model's context."""
    if len(ids) + max_new_tokens > max_seq_len:
        raise ValueError(
            f"The prompt {prompt!r} ({where}) has {len(ids)} tokens; with grpo.max_new_tokens {max_new_tokens} "
            f"it needs {len(ids) + max_new_tokens} positions, more than the model's context of {max_seq_len}. "
            "Lower --grpo.max-new-tokens or use shorter prompts."
        )


def completion_logprobs(
    model: Transformer, completions: list[Completion], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs [N, T] of each completion's tokens under ``model`` (one forward of prompt + completion,
    right-padded), and the mask [N, T] of real completion tokens (T: the longest completion)."""
    device = model.tok_embeddings.weight.device
    sequences = [c.prompt_ids + c.token_ids for c in completions]
    L = max(len(s) for s in sequences)
    T = max(len(c.token_ids) for c in completions)
    tokens_NL = torch.tensor([s + [pad_id] * (L - len(s)) for s in sequences], device=device)
    logits_NLV = model(tokens_NL).float()  # causal: the right padding changes no real position
    # The token at position t + 1 is predicted at position t.
    starts_N = torch.tensor([len(c.prompt_ids) - 1 for c in completions], device=device)
    lengths_N = torch.tensor([len(c.token_ids) for c in completions], device=device)
    positions_NT = (starts_N[:, None] + torch.arange(T, device=device)[None, :]).clamp(max=L - 2)
    logits_NTV = logits_NLV.gather(1, positions_NT[:, :, None].expand(-1, -1, logits_NLV.shape[-1]))
    targets_NT = tokens_NL.gather(1, positions_NT + 1)
    logprobs_NT = logits_NTV.gather(-1, targets_NT[:, :, None])[:, :, 0] - logits_NTV.logsumexp(dim=-1)
    mask_NT = torch.arange(T, device=device)[None, :] < lengths_N[:, None]
    return logprobs_NT, mask_NT


def padded_old_logprobs(completions: list[Completion], T: int, device: torch.device) -> torch.Tensor:
    """The engine's sampling logprobs [N, T], zero-padded."""
    old_NT = torch.zeros(len(completions), T)
    for row, completion in enumerate(completions):
        old_NT[row, : len(completion.token_ids)] = completion.logprobs
    return old_NT.to(device)


@dataclass
class GRPOSetup:
    """What a GRPO run has loaded and checked before it writes anything or starts an engine."""

    recipe: GRPORecipe
    """The recipe."""
    lane: str
    """The trainer's lane."""
    device: torch.device
    """The trainer's device."""
    family: str
    """The model family of ``model.init_from``."""
    model: Transformer
    """The policy being trained (fp32)."""
    tokenizer: SFTTokenizer
    """The SFT run's tokenizer."""
    task: Task
    """The task whose train prompts are rolled out."""
    reward: Reward
    """The reward function rollouts are scored with."""
    plan: list[tuple[list[Example], list[list[int]]]]
    """Each step's prompts and their token ids, every one checked to fit the context."""
    eval_task: Task
    """The task held-out accuracy is measured on."""
    test_examples: list[Example]
    """The held-out prompts (none when evaluation is off)."""


def prepare_grpo(recipe: GRPORecipe, reward: Reward | None = None) -> GRPOSetup:
    """Load the SFT model and its tokenizer, and draw and check every step's prompts, before any work.

    ``ValueError`` names what does not fit: the launch, the lane, ``init_from``, the tokenizer, a prompt.
    """
    if process_info().world_size > 1:
        raise ValueError(
            "GRPO's trainer runs in one process: start it without torchrun (--rollout.mode ray spreads the rollouts)."
        )
    backend = get_backend(recipe.device.lane)
    if backend.lane == "xla":
        raise ValueError("GRPO runs on the cpu, cuda or tpu lanes; the xla lane is not available for it yet.")
    config = recipe.grpo
    device = backend.device(process_info().local_rank)
    torch.manual_seed(recipe.train.seed)
    family, model, tokenizer = load_policy(recipe, device)
    check_fits(tokenizer.tokenizer, tokenizer.spec, model.args.vocab_size)
    task = get_task(config.task)
    check_covers(tokenizer, task)
    plan: list[tuple[list[Example], list[list[int]]]] = []
    for step_number in range(1, recipe.train.steps + 1):
        examples = step_examples(task, recipe, step_number)
        ids = tokenizer.encode_batch([prompt_text(tokenizer, e.prompt, config.format) for e in examples])
        for example, prompt_ids in zip(examples, ids, strict=True):
            check_prompt_fits(
                example.prompt, prompt_ids, config.max_new_tokens, model.args.max_seq_len, f"step {step_number}"
            )
        plan.append((examples, ids))
    eval_task = get_task(recipe.eval_task)
    check_covers(tokenizer, eval_task)
    test_examples = eval_task.examples("test", recipe.eval.examples, recipe.eval.seed) if recipe.eval.enabled else []
    return GRPOSetup(
        recipe,
        backend.lane,
        device,
        family,
        model,
        tokenizer,
        task,
        reward or (task.partial_reward if config.reward == "partial" else task.reward),
        plan,
        eval_task,
        test_examples,
    )


def run_grpo(recipe: GRPORecipe, console: Console | None = None, *, reward: Reward | None = None) -> GRPOResult:
    """GRPO from the SFT model of ``model.init_from``; held-out accuracy before and after; write the run.

    ``reward`` (prompt, completion text, answer) -> float replaces the task's reward that ``grpo.reward``
    picks (exact or partial)."""
    say = (lambda message: console.print(message, soft_wrap=True)) if console is not None else (lambda message: None)
    setup = prepare_grpo(recipe, reward)
    config = recipe.grpo
    engine = open_rollout(recipe.rollout, setup.model, config.prompts_per_step * config.group_size, say)
    try:
        return train_grpo(setup, engine, say)
    finally:
        close_rollout(engine)


class HeldOut:
    """Held-out accuracy at the points a run asks for: greedy, and sampled by the rollout engine."""

    def __init__(self, setup: GRPOSetup, engine: RolloutEngine, writer: JsonlWriter, say: Callable[[str], None]):
        """Score ``setup``'s test prompts with ``setup.model`` and ``engine``; print with ``say``, log to ``writer``."""
        self.setup, self.engine, self.writer, self.say = setup, engine, writer, say
        self.evaluations: dict[str, tuple[int, Evaluation]] = {}
        """Greedy evaluations by label (``before``, ``after``) with their step."""
        self.sampled: dict[str, dict[str, float]] = {}
        """Sampled accuracy (and samples per prompt) by label."""

    def score(self, label: str, step_number: int) -> None:
        """Measure held-out accuracy now and keep it as ``label``."""
        setup, recipe = self.setup, self.setup.recipe
        if not setup.test_examples:
            return
        evaluation = evaluate(
            setup.model,
            setup.tokenizer,
            setup.eval_task,
            setup.test_examples,
            recipe.eval.max_new_tokens,
            format=recipe.grpo.format,
            batch_size=recipe.eval.batch_size,
        )
        self.evaluations[label] = (step_number, evaluation)
        self.say(evaluation.accuracy_line(step_number, f"{label} GRPO", setup.eval_task.name))
        self.writer.write_scalars(step_number, {"eval_accuracy": evaluation.accuracy})
        samples = recipe.grpo.eval_samples
        if samples:
            accuracy = sampled_accuracy(self.engine, setup.tokenizer, setup.eval_task, setup.test_examples, recipe)
            self.sampled[label] = {"sampled_accuracy": accuracy, "samples_per_prompt": samples}
            self.say(
                f"step {step_number}: held-out accuracy {label} GRPO {accuracy:.1%} sampled "
                f"({samples} completions per test prompt at temperature {recipe.grpo.temperature})"
            )
            self.writer.write_scalars(step_number, {"eval_sampled_accuracy": accuracy})

    def fill(self, result: GRPOResult, run_dir: Path) -> None:
        """Put the scores into ``result``, show the first examples and write ``eval.json``."""
        result.before, result.after = score_of(self.evaluations, "before"), score_of(self.evaluations, "after")
        result.sampled_before = self.sampled.get("before", {}).get("sampled_accuracy")
        result.sampled_after = self.sampled.get("after", {}).get("sampled_accuracy")
        if "after" in self.evaluations:
            for line in self.evaluations["after"][1].shown(self.setup.eval_task, self.setup.recipe.eval.show):
                self.say(line)
        if self.evaluations:
            write_eval_file(run_dir / EVAL_FILE, self.setup.eval_task.name, self.evaluations, self.sampled)


def train_grpo(setup: GRPOSetup, engine: RolloutEngine, say: Callable[[str], None]) -> GRPOResult:
    """The GRPO steps of ``setup`` with rollouts from ``engine`` (holding the model's weights as version 0),
    held-out accuracy before and after, and the run directory written."""
    recipe, model, tokenizer = setup.recipe, setup.model, setup.tokenizer
    config, train = recipe.grpo, recipe.train
    reference = copy.deepcopy(model).requires_grad_(False).eval() if config.kl_beta > 0 else None
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=train.lr, betas=(train.beta1, train.beta2), weight_decay=train.weight_decay
    )
    run_dir = prepare_run_dir(recipe)
    tokenizer.save(run_dir)
    result = GRPOResult(
        run_dir,
        setup.lane,
        parameter_count(model),
        f"{recipe.model.init_from} ({setup.family})",
        eval_task=setup.eval_task.name,
        eval_examples=len(setup.test_examples),
        rollout=engine.describe() if isinstance(engine, RayRollout) else "local (this process)",
        checksum=engine.checksum(),
    )
    say(
        f"lane [bold]{setup.lane}[/] on {setup.device}, {setup.family}: {result.parameters:,} parameters from "
        f"{escape(result.started_from)}; {train.steps} steps of {config.prompts_per_step} {setup.task.name} prompts "
        f"x {config.group_size} completions; KL beta {config.kl_beta}"
        + ("" if reference is not None else " (no reference model)")
        + f"; run directory {run_dir}"
    )
    writer = JsonlWriter(run_dir / "metrics.jsonl")
    held_out = HeldOut(setup, engine, writer, say)
    started = time.perf_counter()
    shown_errors = 0
    try:
        if recipe.eval.before:
            held_out.score("before", 0)
        started = time.perf_counter()
        for step_number, (examples, prompt_ids) in enumerate(setup.plan, start=1):
            metrics = grpo_step(
                recipe, model, reference, engine, optimizer, tokenizer, setup.reward, examples, prompt_ids, step_number
            )
            for message in metrics["reward_errors"]:
                if shown_errors < SHOWN_REWARD_ERRORS:
                    shown_errors += 1
                    say(f"[yellow]step {step_number}: {escape(message)}; sample skipped[/]")
            result.history.append(metrics)
            result.steps_done = step_number
            result.skipped_samples += metrics["skipped"]
            result.weights_version, result.checksum = metrics["weights_version"], metrics["checksum"]
            writer.write(metrics)
            if step_number % train.log_every == 0 or step_number == train.steps:
                say(format_metrics(metrics))
        result.wall_seconds = time.perf_counter() - started
        held_out.score("after", result.steps_done)
    except KeyboardInterrupt:
        result.interrupted = True
        result.wall_seconds = time.perf_counter() - started
        say(f"interrupted after {result.steps_done} steps")
    finally:
        writer.close()
    held_out.fill(result, run_dir)
    if recipe.output.save_weights and result.steps_done > 0:
        extra = {"recipe.json": recipe.to_json(), **tokenizer.files()}
        result.weights_path = save_model(
            model, setup.family, run_dir / MODEL_FOLDER, {"step": result.steps_done}, extra_files=extra
        )
        if recipe.export_hf:
            result.hf_path = save_hf_checkpoint(model, setup.family, run_dir / HF_FOLDER)
            tokenizer.save(result.hf_path)
            say(f"exported the model with its tokenizer as a Hugging Face checkpoint: {result.hf_path}")
    return result


def score_completions(
    examples: list[Example], completions: list[Completion], texts: list[str], score_fn: Reward
) -> tuple[list[float | None], list[str]]:
    """Each completion's reward, or ``None`` when the reward function raised or gave a non-finite value;
    and a message for each such failure (the sample is skipped, never scored 0)."""
    rewards: list[float | None] = []
    errors: list[str] = []
    for completion, text in zip(completions, texts, strict=True):
        example = examples[completion.prompt_index]
        try:
            value = float(score_fn(example.prompt, text, example.answer))
            if not math.isfinite(value):
                raise ValueError(f"the reward is {value}")
        except Exception as error:  # any failure of the reward code skips the sample, and says so
            rewards.append(None)
            errors.append(
                f"the reward function raised on prompt {example.prompt!r}, completion {text!r}: "
                f"{type(error).__name__}: {error}"
            )
            continue
        rewards.append(value)
    return rewards, errors


def grpo_step(
    recipe: GRPORecipe,
    model: Transformer,
    reference: Transformer | None,
    engine: RolloutEngine,
    optimizer: torch.optim.Optimizer,
    tokenizer: SFTTokenizer,
    score_fn: Reward,
    examples: list[Example],
    prompt_ids: list[list[int]],
    step_number: int,
) -> dict[str, Any]:
    """One GRPO step (rollout, rewards, advantages, update, sync as version ``step_number``); its metrics
    (``reward_errors`` holds the first few messages of samples skipped because the reward raised)."""
    config, train = recipe.grpo, recipe.train
    start = time.perf_counter()
    params = SamplingParams(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        stop_token_ids=tokenizer.stop_ids,
        seed=train.seed * 100_003 + step_number,
        n=config.group_size,
    )
    completions = engine.generate(prompt_ids, params)
    texts = [tokenizer.decode(c.token_ids) for c in completions]
    rewards, errors = score_completions(examples, completions, texts, score_fn)
    skipped = sum(r is None for r in rewards)

    kept: list[Completion] = []
    kept_rewards: list[float] = []
    advantages: list[float] = []
    zero_signal_groups = 0
    for index in range(len(examples)):
        group = [(c, r) for c, r in zip(completions, rewards, strict=True) if c.prompt_index == index and r is not None]
        if not group:  # every sample of this prompt skipped: the prompt drops out
            continue
        group_rewards = [r for _, r in group]
        advantages += group_advantages([group_rewards])[0].tolist()
        zero_signal_groups += len(set(group_rewards)) == 1
        kept += [c for c, _ in group]
        kept_rewards += group_rewards

    model.train()
    losses, clip_fractions, kls, grad_norms = [], [], [], []
    if kept:
        device = model.tok_embeddings.weight.device
        advantages_N = torch.tensor(advantages, device=device)
        T = max(len(c.token_ids) for c in kept)
        old_NT = padded_old_logprobs(kept, T, device)
        ref_NT = None
        if reference is not None:
            with torch.no_grad():
                ref_NT, _ = completion_logprobs(reference, kept, tokenizer.pad_id)
        for _ in range(config.updates_per_step):
            new_NT, mask_NT = completion_logprobs(model, kept, tokenizer.pad_id)
            loss, clip_fraction = clipped_policy_loss(new_NT, old_NT, advantages_N, mask_NT, config.clip_eps)
            if ref_NT is not None:
                kl = kl_penalty(new_NT, ref_NT, mask_NT)
                loss = loss + config.kl_beta * kl
                kls.append(kl.item())
            for group in optimizer.param_groups:
                group["lr"] = warmup_lr(train, step_number)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip or float("inf"))
            optimizer.step()
            losses.append(loss.item())
            clip_fractions.append(clip_fraction.item())
            grad_norms.append(norm.item())
    sync = sync_weights(model, engine, version=step_number)
    lengths = [len(c.token_ids) for c in kept]
    return {
        "step": step_number,
        "reward_mean": sum(kept_rewards) / len(kept_rewards) if kept_rewards else 0.0,
        "accuracy": sum(r == 1.0 for r in kept_rewards) / len(kept_rewards) if kept_rewards else 0.0,
        "completion_length": sum(lengths) / len(lengths) if lengths else 0.0,
        "kl": sum(kls) / len(kls) if kls else None,
        "loss": losses[-1] if losses else None,
        "lr": warmup_lr(train, step_number),
        "clip_fraction": sum(clip_fractions) / len(clip_fractions) if clip_fractions else 0.0,
        "grad_norm": grad_norms[-1] if grad_norms else None,
        "zero_signal_groups": zero_signal_groups,
        "samples": len(completions),
        "skipped": skipped,
        "reward_errors": errors[:SHOWN_REWARD_ERRORS],
        "sync_seconds": sync.seconds,
        "weights_version": sync.version,
        "checksum": sync.checksum,
        "step_seconds": time.perf_counter() - start,
    }


def format_metrics(metrics: dict[str, Any]) -> str:
    """One console line of a step's metrics."""
    kl = "-" if metrics["kl"] is None else f"{metrics['kl']:.4f}"
    return (
        f"step {metrics['step']:4d}  reward {metrics['reward_mean']:.3f}  acc {metrics['accuracy']:.3f}  "
        f"len {metrics['completion_length']:.1f}  kl {kl}  clip {metrics['clip_fraction']:.3f}  "
        f"flat groups {metrics['zero_signal_groups']}  skipped {metrics['skipped']}  "
        f"sync {metrics['sync_seconds'] * 1000:.0f} ms v{metrics['weights_version']} {metrics['checksum'][:8]}  "
        f"{metrics['step_seconds']:.2f} s"
    )
