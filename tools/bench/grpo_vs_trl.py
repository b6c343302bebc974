"""titanpod's GRPO beside TRL's GRPOTrainer, from the same SFT model with the same settings, on this CPU.

    uv run titanpod-posttrain --recipe sft_arith --output.run-name sft_arith
    cd envs/trl && uv sync --locked
    nice -n 5 uv run python ../../tools/bench/grpo_vs_trl.py --sft ../../runs/sft_arith --seeds 0 1 2

``--sft`` is an SFT run directory: titanpod trains from its ``model/`` folder, TRL from its ``hf/`` folder
(the same weights exported as a Hugging Face checkpoint; the bench checks that they are equal). Both trainers
get the settings of the ``grpo_debug`` recipe (``--recipe``): for each step the same prompts (titanpod's
plan of prompts for the seed, fed to TRL in order), group size, completion length, temperature, top-p,
learning rate with the same warmup, AdamW betas, epsilon and weight decay, gradient clipping, clip range,
KL weight and number of steps, with one optimizer update per step and the loss averaged over every completion
token of the step (TRL's ``dapo`` loss, titanpod's token mean) on rewards scaled within each group.

Held-out accuracy of both is measured by the same code, titanpod's: greedy (``titanpod.runs.evaluation``)
and sampled (``titanpod.rl.grpo.held_out.sampled_accuracy``, the built-in engine at the rollout temperature,
the same seeds before and after) on the task's held-out prompts; TRL's trained model is read back into a
titanpod model from the Hugging Face folder TRL writes. Seconds per step are the mean wall time of steps 2 to
N (rollouts, update and, for titanpod, the weight sync), both trainers run one after the other in this process
with the same torch thread count; CPU seconds per step are the mean user + system time of this process (every
thread, and any child it reaped) over the same steps, which the load of other jobs does not inflate.

Printed: per seed and as mean +- standard error over seeds, held-out greedy and sampled accuracy before and
after, the gain, and wall and CPU seconds per step with TRL's over titanpod's. Written to ``--out``: ``results.json``
(every figure and both reward curves) and ``reward_curves.png``.

TRL, transformers' TRL extras and matplotlib come from ``envs/trl``; the functions the tests import
(``MatchedSettings``, ``trl_config_kwargs``, ``mean_and_stderr``, ``warmup_factor``, ``summary_rows``) need
neither TRL nor matplotlib.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HF_FOLDER, MODEL_FOLDER = "hf", "model"
"""The folders of an SFT run directory the two trainers start from."""


@dataclass(frozen=True)
class MatchedSettings:
    """Every setting both trainers are given, read from one titanpod GRPO recipe."""

    steps: int
    """GRPO steps (rollouts and one optimizer update each)."""
    prompts_per_step: int
    """Prompts per step."""
    group_size: int
    """Completions sampled per prompt."""
    max_new_tokens: int
    """Longest completion, in tokens."""
    temperature: float
    """Sampling temperature of the rollouts (and of every logprob of the objective)."""
    top_p: float
    """Nucleus sampling of the rollouts."""
    lr: float
    """Peak learning rate of AdamW."""
    warmup_steps: int
    """Steps of linear warmup (step ``s`` of ``w`` runs at ``s / w`` of ``lr``), then constant."""
    beta1: float
    """AdamW's first-moment decay."""
    beta2: float
    """AdamW's second-moment decay."""
    adam_eps: float
    """AdamW's epsilon."""
    weight_decay: float
    """AdamW's decoupled weight decay."""
    grad_clip: float
    """Gradient norm clipping."""
    clip_eps: float
    """PPO clip range of the policy ratio."""
    kl_beta: float
    """Weight of the KL penalty to the starting model (0: none)."""
    reward: str
    """The reward both trainers score completions with (a ``grpo.reward`` name)."""

    @property
    def completions_per_step(self) -> int:
        """Completions sampled (and trained on) per step."""
        return self.prompts_per_step * self.group_size

    @classmethod
    def from_recipe(cls, recipe: Any) -> MatchedSettings:
        """The settings of a titanpod ``GRPORecipe``; ``ValueError`` names a setting TRL cannot be given the same:
        more than one update per step, a decay after warmup, gradient accumulation, a custom reward function."""
        grpo, train = recipe.grpo, recipe.train
        problems = []
        if grpo.updates_per_step != 1:
            problems.append(f"grpo.updates_per_step is {grpo.updates_per_step} (the bench compares on-policy steps: 1)")
        if train.decay != "constant":
            problems.append(f"train.decay is {train.decay!r} (the bench matches warmup then constant: 'constant')")
        if train.grad_accum_steps != 1:
            problems.append(f"train.grad_accum_steps is {train.grad_accum_steps} (the bench runs whole steps: 1)")
        if grpo.reward_function is not None or grpo.data_path is not None:
            problems.append("the recipe sets grpo.reward_function or grpo.data_path (the bench uses built-in tasks)")
        if problems:
            raise ValueError("Cannot match this recipe in TRL: " + "; ".join(problems) + ".")
        return cls(
            steps=train.steps,
            prompts_per_step=grpo.prompts_per_step,
            group_size=grpo.group_size,
            max_new_tokens=grpo.max_new_tokens,
            temperature=grpo.temperature,
            top_p=grpo.top_p,
            lr=train.lr,
            warmup_steps=train.resolved_warmup_steps,
            beta1=train.beta1,
            beta2=train.beta2,
            adam_eps=train.eps,
            weight_decay=train.weight_decay,
            grad_clip=train.grad_clip,
            clip_eps=grpo.clip_eps,
            kl_beta=grpo.kl_beta,
            reward=grpo.reward,
        )


def warmup_factor(settings: MatchedSettings, update_index: int) -> float:
    """The share of ``lr`` the optimizer update ``update_index`` (0-based, as torch's LR schedulers count) runs at:
    titanpod's schedule, where GRPO step ``s = update_index + 1`` of ``w`` warmup steps gets ``s / w``."""
    if settings.warmup_steps <= 0:
        return 1.0
    return min(1.0, (update_index + 1) / settings.warmup_steps)


def trl_config_kwargs(settings: MatchedSettings, seed: int, output_dir: str) -> dict[str, Any]:
    """The keyword arguments of TRL's ``GRPOConfig`` that give TRL ``settings``: one generation of
    ``prompts_per_step x group_size`` completions and one update on all of them per step, prompts in the
    dataset's order, no dropout, a token-mean loss over the step, rewards scaled by the group's std, fp32 on
    the CPU. The learning-rate schedule is passed separately (``warmup_factor``), as TRL's schedulers start
    warmup at 0."""
    return {
        "output_dir": output_dir,
        "seed": seed,
        "max_steps": settings.steps,
        "per_device_train_batch_size": settings.completions_per_step,
        "gradient_accumulation_steps": 1,
        "num_generations": settings.group_size,
        "num_iterations": 1,
        "max_completion_length": settings.max_new_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": 0,
        "learning_rate": settings.lr,
        "adam_beta1": settings.beta1,
        "adam_beta2": settings.beta2,
        "adam_epsilon": settings.adam_eps,
        "weight_decay": settings.weight_decay,
        "max_grad_norm": settings.grad_clip,
        "epsilon": settings.clip_eps,
        "beta": settings.kl_beta,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "mask_truncated_completions": False,
        "shuffle_dataset": False,
        "disable_dropout": True,
        "gradient_checkpointing": False,  # TRL's default recomputes activations; titanpod's step keeps them
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "dataloader_num_workers": 0,
        "log_completions": False,
    }


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (sample std / sqrt(n)); the error is NaN for one value."""
    if not values:
        raise ValueError("mean_and_stderr needs at least one value.")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, statistics.stdev(values) / math.sqrt(len(values))


@dataclass
class TrainerRun:
    """One trainer's run from the SFT model with one seed."""

    trainer: str
    """``titanpod`` or ``trl``."""
    seed: int
    """The seed (prompts of every step, sampling)."""
    greedy_before: float
    """Held-out greedy accuracy of the SFT model."""
    greedy_after: float
    """Held-out greedy accuracy after the steps."""
    sampled_before: float
    """Held-out sampled accuracy of the SFT model."""
    sampled_after: float
    """Held-out sampled accuracy after the steps."""
    rewards: list[float] = field(default_factory=list)
    """Mean training reward of each step."""
    step_seconds: list[float] = field(default_factory=list)
    """Wall time of each step."""
    step_cpu_seconds: list[float] = field(default_factory=list)
    """CPU time (user + system, every thread of the process and its reaped children) of each step."""

    @property
    def greedy_gain(self) -> float:
        """Held-out greedy accuracy after minus before."""
        return self.greedy_after - self.greedy_before

    @property
    def sampled_gain(self) -> float:
        """Held-out sampled accuracy after minus before."""
        return self.sampled_after - self.sampled_before

    @property
    def seconds_per_step(self) -> float:
        """Mean wall time of steps 2 to N (the first step also warms up)."""
        timed = self.step_seconds[1:] or self.step_seconds
        return statistics.fmean(timed)

    @property
    def cpu_seconds_per_step(self) -> float:
        """Mean CPU time of steps 2 to N: the step's cost, which other jobs' load on the machine does not inflate
        (NaN when the run recorded none)."""
        timed = self.step_cpu_seconds[1:] or self.step_cpu_seconds
        return statistics.fmean(timed) if timed else math.nan


def summary_rows(runs: Sequence[TrainerRun]) -> list[tuple[str, str, str]]:
    """The table: one row per figure, with titanpod's and TRL's per-seed values and mean +- standard error."""

    def cell(trainer: str, figure: str, scale: float, digits: int) -> str:
        chosen = sorted((r for r in runs if r.trainer == trainer), key=lambda r: r.seed)
        if not chosen:
            return "-"
        values = [getattr(r, figure) * scale for r in chosen]
        mean, err = mean_and_stderr(values)
        per_seed = ", ".join(f"{v:.{digits}f}" for v in values)
        spread = "" if math.isnan(err) else f" +- {err:.{digits}f}"
        return f"{mean:.{digits}f}{spread} ({per_seed})"

    rows = []
    for label, figure, scale, digits in (
        ("held-out greedy before (%)", "greedy_before", 100, 1),
        ("held-out greedy after (%)", "greedy_after", 100, 1),
        ("greedy gain (points)", "greedy_gain", 100, 1),
        ("held-out sampled before (%)", "sampled_before", 100, 1),
        ("held-out sampled after (%)", "sampled_after", 100, 1),
        ("sampled gain (points)", "sampled_gain", 100, 1),
        ("wall seconds per step", "seconds_per_step", 1, 2),
        ("CPU seconds per step", "cpu_seconds_per_step", 1, 2),
    ):
        rows.append((label, cell("titanpod", figure, scale, digits), cell("trl", figure, scale, digits)))
    return rows


def speed_ratio(runs: Sequence[TrainerRun], figure: str = "seconds_per_step") -> float:
    """TRL's mean of ``figure`` (``seconds_per_step``: wall; ``cpu_seconds_per_step``: CPU) over titanpod's
    (above 1: titanpod's step is faster)."""
    mean = {t: statistics.fmean(getattr(r, figure) for r in runs if r.trainer == t) for t in ("titanpod", "trl")}
    return mean["trl"] / mean["titanpod"]


# ---- running the two trainers (needs envs/trl) -------------------------------------------------------------


def bench_recipe(
    name: str,
    sft_dir: Path,
    seed: int,
    runs_dir: Path,
    steps: int | None = None,
    prompts_per_step: int | None = None,
    eval_examples: int | None = None,
    lr: float | None = None,
) -> Any:
    """The titanpod GRPO recipe ``name`` from ``sft_dir``'s model, seeded ``seed``, writing under ``runs_dir``;
    ``steps``, ``prompts_per_step``, ``eval_examples`` and ``lr`` replace the recipe's when given."""
    from titanpod.recipes.posttrain.grpo_recipe import GRPOModelConfig
    from titanpod.recipes.posttrain.registry import get_posttrain_recipe

    recipe = get_posttrain_recipe(name).build()
    steps = steps or recipe.train.steps
    warmup = min(recipe.train.resolved_warmup_steps, steps // 3)  # a shortened run keeps its warmup inside it
    train = dataclasses.replace(recipe.train, seed=seed, steps=steps, warmup_steps=warmup, lr=lr or recipe.train.lr)
    output = dataclasses.replace(
        recipe.output, runs_dir=str(runs_dir), run_name=f"titanpod_seed{seed}", start_over=True, tensorboard=False
    )
    checkpoint = dataclasses.replace(recipe.checkpoint, at_end=False, export_hf=False)
    grpo = dataclasses.replace(recipe.grpo, prompts_per_step=prompts_per_step or recipe.grpo.prompts_per_step)
    evaluation = dataclasses.replace(recipe.eval, examples=eval_examples or recipe.eval.examples)
    return dataclasses.replace(
        recipe,
        grpo=grpo,
        eval=evaluation,
        model=GRPOModelConfig(init_from=str(sft_dir / MODEL_FOLDER)),
        train=train,
        output=output,
        checkpoint=checkpoint,
    )


class HeldOutScorer:
    """titanpod's held-out evaluation of any titanpod model: greedy and sampled, on the recipe's test prompts."""

    def __init__(self, recipe: Any) -> None:
        """Read the tokenizer, task and test prompts ``recipe`` evaluates on."""
        from titanpod.rl.grpo.setup import prepare_grpo

        self.setup = prepare_grpo(recipe)

    def score(self, model: Any) -> tuple[float, float]:
        """(greedy, sampled) held-out accuracy of ``model``."""
        from titanpod.rl.grpo.held_out import sampled_accuracy
        from titanpod.rl.rollout import BuiltinEngine
        from titanpod.runs.evaluation import evaluate

        setup, recipe = self.setup, self.setup.recipe
        greedy = evaluate(
            model,
            setup.tokenizer,
            setup.eval_task,
            setup.test_examples,
            recipe.eval.max_new_tokens,
            format=recipe.grpo.format,
            batch_size=recipe.eval.batch_size,
        ).accuracy
        engine = BuiltinEngine(model, max_batch=recipe.eval.batch_size)
        sampled = sampled_accuracy(engine, setup.tokenizer, setup.eval_task, setup.test_examples, recipe)
        return greedy, sampled


def load_hf_as_titanpod(folder: Path) -> Any:
    """A Hugging Face folder (the SFT export or TRL's output) as a titanpod model, fp32."""
    from titanpod.checkpoint.hf_files import load_hf_checkpoint
    from titanpod.recipes.families.catalog import decoder_adapters

    return load_hf_checkpoint(folder, "cpu", adapters=decoder_adapters()).model.float()


def check_same_weights(sft_dir: Path) -> None:
    """``ValueError`` unless the SFT run's ``hf/`` export holds exactly the weights of its ``model/`` folder."""
    import torch

    from titanpod.checkpoint import load_model

    _, native = load_model(sft_dir / MODEL_FOLDER, "cpu")
    exported = load_hf_as_titanpod(sft_dir / HF_FOLDER)
    for (name, a), (_, b) in zip(native.state_dict().items(), exported.state_dict().items(), strict=True):
        if not torch.equal(a.float(), b.float()):
            raise ValueError(
                f"{sft_dir / HF_FOLDER} differs from {sft_dir / MODEL_FOLDER} at {name}: re-run the SFT with "
                "--checkpoint.export-hf true so both trainers start from the same weights."
            )


def run_titanpod(recipe: Any, scorer: HeldOutScorer) -> TrainerRun:
    """titanpod's GRPO run of ``recipe`` (held-out accuracy measured by the run itself, with the same code)."""
    from titanpod.rl.grpo.run import run_grpo

    result = run_grpo(recipe)
    if result.steps_done < recipe.train.steps:  # an interrupt stops the run early: it saves what it has and returns
        raise KeyboardInterrupt
    assert result.before is not None and result.after is not None
    assert result.sampled_before is not None and result.sampled_after is not None
    return TrainerRun(
        "titanpod",
        recipe.train.seed,
        result.before.accuracy,
        result.after.accuracy,
        result.sampled_before,
        result.sampled_after,
        rewards=[m.reward_mean for m in result.history],
        step_seconds=[m.step_seconds for m in result.history],
        step_cpu_seconds=[m.step_cpu_seconds for m in result.history],
    )


def trl_dataset(recipe: Any, scorer: HeldOutScorer) -> Any:
    """Every step's prompts of titanpod's plan for ``recipe`` in order (TRL reads them in order), with answers."""
    from datasets import Dataset

    plan = scorer.setup.plan
    rows = [
        {"prompt": example.prompt, "answer": example.answer}
        for step in range(1, recipe.train.steps + 1)
        for example in plan.prompts(step).examples
    ]
    return Dataset.from_list(rows)


def check_tokenizers_agree(hf_tokenizer: Any, scorer: HeldOutScorer, prompts: Sequence[str]) -> None:
    """``ValueError`` unless TRL's tokenizer encodes ``prompts`` to the ids titanpod's rollouts use."""
    ours = scorer.setup.tokenizer.encode_batch(list(prompts))
    theirs = hf_tokenizer(text=list(prompts))["input_ids"]
    if ours != theirs:
        raise ValueError(
            f"The Hugging Face tokenizer encodes {prompts[0]!r} as {theirs[0]}, titanpod as {ours[0]}: the two "
            "trainers would not see the same prompts."
        )


def run_trl(
    recipe: Any,
    settings: MatchedSettings,
    sft_dir: Path,
    scorer: HeldOutScorer,
    work: Path,
    before: tuple[float, float],
) -> TrainerRun:
    """TRL's GRPOTrainer from ``sft_dir/hf`` with ``settings``; held-out accuracy by ``scorer`` before and after."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from titanpod.rl.grpo.cpu_time import process_cpu_seconds
    from titanpod.rl.grpo.setup import choose_reward

    seed = recipe.train.seed
    reward = choose_reward(recipe.grpo, scorer.setup.task)

    def reward_func(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [float(reward(p, c, a)) for p, c, a in zip(prompts, completions, answer, strict=True)]

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.cpu_seconds: list[float] = []
            self.started = self.cpu_started = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started, self.cpu_started = time.perf_counter(), process_cpu_seconds()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)
            self.cpu_seconds.append(process_cpu_seconds() - self.cpu_started)

    tokenizer = AutoTokenizer.from_pretrained(sft_dir / HF_FOLDER)
    dataset = trl_dataset(recipe, scorer)
    check_tokenizers_agree(tokenizer, scorer, dataset["prompt"][:8])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(sft_dir / HF_FOLDER, dtype=torch.float32)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=settings.lr,
        betas=(settings.beta1, settings.beta2),
        eps=settings.adam_eps,
        weight_decay=settings.weight_decay,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda index: warmup_factor(settings, index))
    timer = StepTimes()
    out = work / f"trl_seed{seed}"
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_func,
        args=GRPOConfig(**trl_config_kwargs(settings, seed, str(out))),
        train_dataset=dataset,
        processing_class=tokenizer,
        optimizers=(optimizer, schedule),
        callbacks=[timer],
    )
    trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    trainer.model.save_pretrained(out / HF_FOLDER)
    greedy, sampled = scorer.score(load_hf_as_titanpod(out / HF_FOLDER))
    return TrainerRun(
        "trl",
        seed,
        before[0],
        greedy,
        before[1],
        sampled,
        rewards=rewards,
        step_seconds=timer.seconds,
        step_cpu_seconds=timer.cpu_seconds,
    )


def draw_curves(runs: Sequence[TrainerRun], path: Path) -> None:
    """Both trainers' training reward per step (each seed thin, the mean over seeds thick) in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for trainer, colour in (("titanpod", "tab:blue"), ("trl", "tab:orange")):
        chosen = [r for r in runs if r.trainer == trainer]
        for run in chosen:
            axes.plot(range(1, len(run.rewards) + 1), run.rewards, color=colour, alpha=0.25, linewidth=0.8)
        length = min(len(r.rewards) for r in chosen)
        mean = [statistics.fmean(r.rewards[i] for r in chosen) for i in range(length)]
        label = "titanpod GRPO" if trainer == "titanpod" else "TRL GRPOTrainer"
        axes.plot(range(1, length + 1), mean, color=colour, linewidth=2, label=f"{label} (mean of {len(chosen)})")
    axes.set_xlabel("GRPO step")
    axes.set_ylabel("mean training reward")
    axes.set_title("GRPO on arith from the same SFT model")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def print_table(runs: Sequence[TrainerRun], settings: MatchedSettings) -> None:
    """The comparison table, with the settings both trainers were given."""
    seeds = sorted({r.seed for r in runs})
    print(
        f"\nGRPO, {settings.steps} steps of {settings.prompts_per_step} prompts x {settings.group_size}, seeds {seeds}"
    )
    print(f"{'figure':<30}{'titanpod: mean +- s.e. (per seed)':<44}TRL: mean +- s.e. (per seed)")
    for label, ours, theirs in summary_rows(runs):
        print(f"{label:<30}{ours:<44}{theirs}")
    print(
        f"TRL's seconds per step / titanpod's: wall {speed_ratio(runs):.2f}, "
        f"CPU {speed_ratio(runs, 'cpu_seconds_per_step'):.2f}"
    )


def read_results(path: Path) -> tuple[dict[str, Any], list[TrainerRun]]:
    """The settings and runs a ``results.json`` written by this bench holds; ``ValueError`` naming the file when
    it is not one."""
    try:
        held = json.loads(path.read_text())
        return held["settings"], [TrainerRun(**row) for row in held["runs"]]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a results.json this bench wrote ({error!r}); run the bench again") from error


def earlier_runs(path: Path) -> list[TrainerRun]:
    """The runs a previous ``results.json`` holds (none when it does not exist)."""
    return read_results(path)[1] if path.is_file() else []


def merged_runs(folders: Sequence[Path]) -> tuple[dict[str, Any], list[TrainerRun]]:
    """The settings and runs of every ``folder/results.json``, for seeds run by separate bench processes.

    ``ValueError`` when a file is missing, when the folders were run with different settings, or when two hold
    the same trainer and seed.
    """
    settings: dict[str, Any] | None = None
    runs: list[TrainerRun] = []
    for folder in folders:
        path = folder / "results.json"
        if not path.is_file():
            raise ValueError(f"--merge {folder}: no results.json there; name folders a bench run wrote with --out")
        held, held_runs = read_results(path)
        if settings is not None and held != settings:
            raise ValueError(
                f"--merge {folder}: its settings differ from {folders[0]}'s, so its runs are not comparable: "
                f"{held} against {settings}"
            )
        settings = held
        for run in held_runs:
            if any((r.trainer, r.seed) == (run.trainer, run.seed) for r in runs):
                raise ValueError(f"--merge {folder}: {run.trainer} seed {run.seed} is already in an earlier folder")
            runs.append(run)
    return settings or {}, runs


def write_results(out: Path, settings: dict[str, Any], runs: Sequence[TrainerRun]) -> None:
    """``results.json`` (settings and every run) and ``reward_curves.png`` in ``out``."""
    partial = out / "results.json.partial"  # renamed into place, so a kill mid-write keeps the previous file
    partial.write_text(json.dumps({"settings": settings, "runs": [dataclasses.asdict(r) for r in runs]}, indent=1))
    partial.replace(out / "results.json")
    draw_curves(runs, out / "reward_curves.png")
    print(f"wrote {out / 'results.json'} and {out / 'reward_curves.png'}", flush=True)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft", type=Path, help="SFT run directory (with model/ and hf/); required unless --merge")
    parser.add_argument("--recipe", default="grpo_debug", help="titanpod GRPO recipe whose settings both get")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="replace the recipe's GRPO steps")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="replace the recipe's prompts per step")
    parser.add_argument("--eval-examples", type=int, default=None, help="replace the recipe's held-out prompts")
    parser.add_argument("--lr", type=float, default=None, help="replace the recipe's learning rate (both trainers)")
    parser.add_argument(
        "--add", action="store_true", help="keep the runs of --out's results.json and run only the seeds it lacks"
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="instead of training: gather the results.json of these --out folders (seeds run by separate "
        "processes) into --out, print the table and draw the curves",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/grpo_vs_trl"))
    args = parser.parse_args(argv)
    if args.merge:
        return args
    if args.sft is None:
        parser.error("--sft is required: the SFT run directory both trainers start from (or --merge folders)")
    missing = [
        name
        for name in (MODEL_FOLDER, HF_FOLDER)
        if not (args.sft / name / "model.json").is_file() and not (args.sft / name / "config.json").is_file()
    ]
    if missing:
        parser.error(
            f"--sft {args.sft} lacks {' and '.join(f'{name}/' for name in missing)}: name an SFT run directory "
            "written with an HF export, e.g. `uv run titanpod-posttrain --recipe sft_arith --output.run-name "
            "sft_arith` and then --sft runs/sft_arith"
        )
    return args


def main(argv: Sequence[str] | None = None) -> list[TrainerRun]:
    """Run both trainers for every seed; print the table; write results.json and reward_curves.png."""
    import torch

    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        try:
            held, runs = merged_runs(args.merge)
            settings = MatchedSettings(**held)
        except (ValueError, TypeError) as error:
            raise SystemExit(f"grpo_vs_trl.py: {error}") from error
        print_table(runs, settings)
        write_results(args.out, held, runs)
        return runs
    check_same_weights(args.sft)
    runs = earlier_runs(args.out / "results.json") if args.add else []
    trl_before: tuple[float, float] | None = None
    for seed in [s for s in args.seeds if s not in {r.seed for r in runs}]:
        recipe = bench_recipe(
            args.recipe, args.sft, seed, args.out, args.steps, args.prompts_per_step, args.eval_examples, args.lr
        )
        settings = MatchedSettings.from_recipe(recipe)
        scorer = HeldOutScorer(recipe)
        if trl_before is None:
            trl_before = scorer.score(load_hf_as_titanpod(args.sft / HF_FOLDER))
            print(
                f"SFT start (from hf/), titanpod's evaluation: greedy {trl_before[0]:.1%}, sampled {trl_before[1]:.1%}"
            )
        print(f"\n== seed {seed}: titanpod (torch threads {torch.get_num_threads()})", flush=True)
        runs.append(run_titanpod(recipe, scorer))
        print(f"\n== seed {seed}: TRL", flush=True)
        runs.append(run_trl(recipe, settings, args.sft, scorer, args.out, trl_before))
        for run in runs[-2:]:
            print(
                f"seed {seed} {run.trainer}: greedy {run.greedy_before:.1%} -> {run.greedy_after:.1%}, sampled "
                f"{run.sampled_before:.1%} -> {run.sampled_after:.1%}, {run.seconds_per_step:.2f} s/step "
                f"({run.cpu_seconds_per_step:.2f} CPU s/step)",
                flush=True,
            )
        print_table(runs, settings)  # after every seed, so a run cut short still leaves its table and curves
        write_results(args.out, dataclasses.asdict(settings), runs)
    return runs


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:
        raise SystemExit(
            "grpo_vs_trl.py: stopped; --out's results.json keeps every seed that finished: run the same command "
            "with --add to run only the others"
        ) from None
