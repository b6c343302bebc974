"""A GRPO run from a ``GRPORecipe``: rollouts from an engine that holds its own copy of the weights, the
clipped group-relative objective trained by the graph's step, and a verified weight sync after every step.

Each step: take the step's ``prompts_per_step`` prompts (drawn with the step's seed), sample
``group_size`` completions of each (completions stop at the end token; seeds depend only on the step,
prompt and sample, so every engine and every split of the prompts draws the same completions), score
them with the task's reward (a reward that raises is logged and the sample skipped and counted, never
scored 0), turn rewards into group-relative advantages, and train ``updates_per_step`` graph steps on
the same rollouts (the functional AdamW, schedule, clipping, precision and step mode of ``train``).
Then the engine gets the whole weights as version ``step`` and must report the trainer's checksum.

Under torchrun the policy is sharded by its family's plan and ``parallel``; each data rank samples
its block of the step's prompts with its own engine and trains on it, and the loss is the step-wide
token mean whatever the split (see ``titanpod.rl.grpo.batches``).

The run directory (a ``titanpod.runs.session.RunSession``) holds recipe.json, tokenizer.json (+
tokenizer_config.json), metrics.jsonl (one line per step), checkpoints/ (trainer state and the
step reached, to resume exactly), eval.json (held-out accuracy before and after), model/ (titanpod
weights with the tokenizer, loadable as the next run's ``--model.init-from``) and, with
``checkpoint.export_hf``, hf/.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from titanpod.checkpoint import save_hf_checkpoint, save_model
from titanpod.graph import JsonlWriter, TrainSummary, build_step, mfu
from titanpod.graph.interrupt import stop_after_step
from titanpod.graph.stop_agreement import StopAgreement
from titanpod.models import Transformer, parameter_count
from titanpod.recipes.families import hf_adapter
from titanpod.recipes.posttrain.grpo_recipe import GRPORecipe
from titanpod.rl.grpo.held_out import HeldOut
from titanpod.rl.grpo.metrics import GRPOStepMetrics
from titanpod.rl.grpo.objective import GRPOObjective
from titanpod.rl.grpo.result import GRPOResult
from titanpod.rl.grpo.rewards import Reward
from titanpod.rl.grpo.setup import GRPOSetup, prepare_grpo, rank_share
from titanpod.rl.grpo.sharding import shard_policy, sync_engine
from titanpod.rl.grpo.trainer import GRPOTrainer
from titanpod.rl.rollout import BuiltinEngine, RolloutEngine
from titanpod.rl.rollout.engines import close_rollout, open_rollout
from titanpod.runs.hf_export import post_training_tokenizer, training_extras
from titanpod.runs.pretrain import describe_step
from titanpod.runs.session import RunSession
from titanpod.runs.sft import HF_FOLDER, MODEL_FOLDER

PRINTED_REWARD_ERRORS = 5
"""Reward errors a run prints in full; later ones are only counted (and kept in metrics.jsonl)."""


def run_grpo(recipe: GRPORecipe, console: Console | None = None, *, reward: Reward | None = None) -> GRPOResult:
    """GRPO from the SFT model of ``model.init_from``; held-out accuracy before and after; write the run.

    ``reward`` (prompt, completion text, answer) -> float replaces the task's reward that ``grpo.reward``
    picks (exact or partial). Everything is loaded and checked before the run directory is written.
    """
    setup = prepare_grpo(recipe, reward)
    with RunSession(recipe, setup.backend, console) as session:
        if session.is_main:
            setup.tokenizer.save(session.run_dir)
        reference = copy.deepcopy(setup.model).requires_grad_(False).eval() if recipe.grpo.kl_beta > 0 else None
        rows = recipe.grpo.prompts_per_step // setup.data_ranks * recipe.grpo.group_size
        # before sharding: whole weights
        engine = open_rollout(recipe.rollout, setup.model, rows, session.say, family=setup.family)
        try:
            return train_grpo(setup, session, engine, reference)
        finally:
            close_rollout(engine)


def describe_rollout(engine: RolloutEngine, processes: int) -> str:
    """Where rollouts are sampled, in words."""
    if isinstance(engine, BuiltinEngine):
        return "local (this process)" if processes == 1 else f"local (each of {processes} processes, its share)"
    describe = getattr(engine, "describe", None)
    return describe() if callable(describe) else type(engine).__name__


def write_step(session: RunSession, metrics: GRPOStepMetrics) -> None:
    """Append a step's metrics to the run's writers: every field to metrics.jsonl, the figures to TensorBoard."""
    for writer in session.writers:
        if isinstance(writer, JsonlWriter):
            writer.write(metrics.record())
        else:
            writer.write(metrics)  # type: ignore[arg-type]  # scalars train/<name> from metrics.logged()


def train_grpo(
    setup: GRPOSetup, session: RunSession, engine: RolloutEngine, reference: Transformer | None
) -> GRPOResult:
    """The GRPO steps of ``setup`` in ``session`` with rollouts from ``engine`` (holding the starting weights as
    version 0): resume, held-out accuracy before and after, checkpoints, final weights."""
    recipe, policy, say = setup.recipe, setup.model, session.say
    info, train = session.info, recipe.train
    parameters = parameter_count(policy)
    flops_per_token = policy.flops_per_token(setup.plan.sequence_length)
    result = GRPOResult(
        session.run_dir,
        setup.backend.lane,
        parameters,
        f"{recipe.model.init_from} ({setup.family})",
        describe_step(train, setup.backend),
        describe_rollout(engine, info.world_size),
        eval_task=setup.eval_task.name,
        eval_examples=len(setup.test_examples),
        checksum=engine.checksum(),
    )
    sharding = shard_policy(policy, setup.family, recipe.parallel, setup.backend, info.world_size)
    step = build_step(GRPOObjective(policy, recipe.grpo.clip_eps, recipe.grpo.kl_beta), train, setup.backend)
    start = session.resume(policy, step, setup.plan)
    if start > 0:  # the engine holds the starting weights: give it the resumed ones
        report = sync_engine(policy, engine, start)
        result.weights_version, result.checksum = report.version, report.checksum
    trainer = GRPOTrainer(setup, engine, step, sharding, rank_share(setup, sharding.data_rank), reference)
    say(
        f"lane [bold]{setup.backend.lane}[/] on {setup.device}, {setup.family}: {parameters:,} parameters from "
        f"{escape(result.started_from)}; {train.steps} steps of {recipe.grpo.prompts_per_step} {setup.task.name} "
        f"prompts x {recipe.grpo.group_size} completions, {recipe.grpo.updates_per_step} update(s) each, step "
        f"{result.step_description}; KL beta {recipe.grpo.kl_beta}"
        + ("" if reference is not None else " (no reference model)")
        + f"; run directory {session.run_dir}"
    )
    # Greedy held-out accuracy needs a whole model holding the engine's weights: a sharded policy is not one.
    eval_model = policy if info.world_size == 1 else engine.model  # type: ignore[attr-defined]
    held_out = HeldOut(setup, engine, session.write_scalars, say)
    if recipe.eval.before and session.is_main:
        held_out.score("before", start, eval_model)
    summary = result.summary = run_steps(setup, session, trainer, result, flops_per_token)
    step.finish()
    if not summary.interrupted and session.is_main:
        held_out.score("after", summary.steps_done, eval_model)
    session.write_summary(summary)  # TensorBoard's hyper-parameter metrics, W&B's summary
    session.save_at_end(summary)  # nothing after a stop at once: the weights may be half-updated
    session.checkpointer.wait()
    if session.is_main:
        held_out.fill(result, session.run_dir)
    result.weights_path = session.save_final_weights(summary, lambda: write_model(setup, result, say))
    return result


def run_steps(
    setup: GRPOSetup, session: RunSession, trainer: GRPOTrainer, result: GRPOResult, flops_per_token: float
) -> TrainSummary:
    """GRPO steps from the resumed one to ``train.stop_at_step`` (or ``train.steps``); metrics, interval
    checkpoints and SIGINT or SIGTERM (the step in flight finishes, then the run stops; a second signal
    stops at once). The summary counts the tokens of every update (``flops_per_token`` each) for
    throughput and MFU."""
    recipe, train, say = setup.recipe, setup.recipe.train, session.say
    start, last = session.start_step, train.stop_at_step or train.steps
    tokens_per_step = recipe.grpo.prompts_per_step * recipe.grpo.group_size * setup.plan.sequence_length
    tokens_per_step *= recipe.grpo.updates_per_step
    losses: list[float] = []
    skipped_steps: list[int] = []
    shown_errors, interrupted, stopped_because = 0, False, None
    stop_signal, stopped_at_once = None, False
    began = first_done = time.perf_counter()
    agreement = StopAgreement(setup.backend)
    profiler = session.profiler  # profile.steps: traced from rollouts to update
    with stop_after_step() as stop:
        try:
            if profiler is not None:
                profiler.before_step(start + 1)
            for step_number in range(start + 1, last + 1):
                metrics = trainer(step_number)
                if profiler is not None:
                    profiler.after_step(step_number)
                setup.plan.steps_done = step_number
                if step_number == start + 1:
                    first_done = time.perf_counter()
                for message in metrics.reward_errors:
                    if shown_errors < PRINTED_REWARD_ERRORS:
                        shown_errors += 1
                        say(f"[yellow]step {step_number}: {escape(message)}; sample skipped[/]")
                result.history.append(metrics)
                result.skipped_samples += metrics.skipped
                result.weights_version, result.checksum = metrics.weights_version, metrics.checksum
                losses.append(math.nan if metrics.loss is None else metrics.loss)
                if metrics.skipped_updates:
                    skipped_steps.append(step_number)
                write_step(session, metrics)
                if step_number % train.log_every == 0 or step_number == last:
                    say(metrics.line())
                nonfinite_loss = metrics.loss is not None and not math.isfinite(metrics.loss)
                if (metrics.skipped_updates or nonfinite_loss) and not train.skip_nonfinite:
                    found = (
                        f"the gradient norm is {metrics.grad_norm}; the update was not applied"
                        if metrics.skipped_updates
                        else f"the loss is {metrics.loss} (gradient norm {metrics.grad_norm})"
                    )
                    stopped_because = (
                        f"step {step_number}: {found} and the run stopped. Lower train.lr, raise "
                        "train.warmup_steps, or set train.skip_nonfinite=True to skip such updates."
                    )
                    say(f"[red]{stopped_because}[/]")
                    break
                if recipe.checkpoint.every and step_number % recipe.checkpoint.every == 0:
                    session.save_checkpoint(step_number)
                session.checkpointer.poll()
                if profiler is not None and step_number < last:
                    profiler.before_step(step_number + 1)
                signum = agreement.signal(stop)  # every process stops after the same step
                if signum is not None and step_number < last:
                    interrupted, stop_signal = True, signum
                    break
        except KeyboardInterrupt:  # a second signal, Ctrl-C outside the main thread: maybe inside a step
            interrupted, stop_signal, stopped_at_once = True, stop.signal_at_once(), True
        finally:
            if profiler is not None:
                profiler.close()  # a trace cut short by a stop is still written
    end = time.perf_counter()
    result.stopped_because = stopped_because
    timed = end - first_done
    tokens_after_first = tokens_per_step * max(len(losses) - 1, 0)
    tokens_per_second = tokens_after_first / timed if tokens_after_first and timed > 0 else 0.0
    backend = setup.backend
    return TrainSummary(
        steps_done=setup.plan.steps_done,
        losses=losses,
        tokens_per_second=tokens_per_second,
        mfu=mfu(flops_per_token, tokens_per_second, session.devices, backend.chip().peak_flops),
        peak_memory_gib=backend.memory_stats(session.info.local_rank).peak_gib,
        wall_seconds=end - began,
        interrupted=interrupted,
        stop_signal=stop_signal,
        stopped_at_once=stopped_at_once,
        skipped_steps=skipped_steps,
        stopped_because=stopped_because,
        start_step=start,
    )


def write_model(setup: GRPOSetup, result: GRPOResult, say: Callable[[str], None]) -> Path:
    """Write the trained policy to ``<run>/model`` with the recipe and tokenizer; with ``checkpoint.export_hf``
    also as a Hugging Face checkpoint in ``<run>/hf``. Every rank calls it: a sharded policy is gathered one
    tensor at a time and rank 0 writes. Returns the weights file."""
    recipe, tokenizer, run_dir = setup.recipe, setup.tokenizer, result.run_dir
    steps = setup.plan.steps_done
    extras = training_extras(
        recipe.to_dict(),
        setup.family,
        parameter_count(setup.model),
        steps,
        tokenizer=post_training_tokenizer(tokenizer),
        notes=[f"Post-trained with GRPO from {recipe.model.init_from}."],
    )
    path = save_model(
        setup.model,
        setup.family,
        run_dir / MODEL_FOLDER,
        {"step": steps},
        extra_files={"recipe.json": recipe.to_json(), **extras.tokenizer_files},
        special_tokens=extras.special_tokens,
        about=extras.about,
    )
    if recipe.checkpoint.export_hf:
        result.hf_path = save_hf_checkpoint(
            setup.model,
            hf_adapter(setup.family),
            run_dir / HF_FOLDER,
            special_tokens=extras.special_tokens,
            extra_files=extras.hf_files(),
        )
        say(f"exported the model with its tokenizer as a Hugging Face checkpoint: {result.hf_path}")
    return path
