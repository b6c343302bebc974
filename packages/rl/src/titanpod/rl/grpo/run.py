"""A GRPO run from a ``GRPORecipe``: rollouts from an engine that holds its own copy of the weights, the
clipped group-relative objective trained by the graph's step, and a verified weight sync after every step.

Each step: take the step's ``prompts_per_step`` prompts (drawn with the step's seed), sample
``group_size`` completions of each (completions stop at the end token; seeds depend only on the step,
prompt and sample, so every engine and every split of the prompts draws the same completions), score
them with the task's reward, each call within ``grpo.reward_timeout_s`` (a reward that raises is logged and the
sample skipped and counted, never scored 0; a step where every sample raised stops the run after it, see
``titanpod.rl.grpo.reward_stop``; a call past its time limit, a ``sys.exit``, or a reward that is NaN, infinite or
absurdly large stops the run within the step, untrained, see ``titanpod.rl.grpo.rewards``), turn rewards into
group-relative advantages, and train
``updates_per_step`` graph steps on the same rollouts (the functional AdamW, schedule, clipping, precision and
step mode of ``train``).
Then the weights stream into the engine as version ``step``, one gathered tensor at a time in the engine's
dtype (``rollout.dtype``), and it must report the trainer's checksum of them.

Under torchrun the policy is sharded by its family's plan and ``parallel`` and each rank reads only its own
shards from ``model.init_from``; each data rank samples its block of the step's prompts with its own engine and
trains on it, and the loss is the step-wide token mean whatever the split (see ``titanpod.rl.grpo.batches``).

The run directory (a ``titanpod.runs.session.RunSession``) holds recipe.json, tokenizer.json (+
tokenizer_config.json), metrics.jsonl (one line per step), checkpoints/ (trainer state and the
step reached, to resume exactly), eval.json (held-out accuracy before and after), rewards.png (reward and
accuracy curves), loss.png, model/ (titanpod weights with the tokenizer, loadable as the next run's
``--model.init-from``) and, with ``checkpoint.export_hf``, hf/.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from titanpod.checkpoint.model_card import public_name
from titanpod.graph import JsonlWriter, MfuGauge, TrainSummary, build_step
from titanpod.graph.step_driver import StepCheck, drive_steps
from titanpod.graph.throughput import ThroughputMeter
from titanpod.models import Transformer, parameter_count
from titanpod.recipes.posttrain.grpo_recipe import GRPORecipe
from titanpod.rl.grpo.held_out import HeldOut
from titanpod.rl.grpo.metrics import GRPOStepMetrics
from titanpod.rl.grpo.objective import GRPOObjective
from titanpod.rl.grpo.result import GRPOResult
from titanpod.rl.grpo.reward_call import PeerRewardStop, RewardStop
from titanpod.rl.grpo.reward_plot import draw_reward_plot
from titanpod.rl.grpo.reward_stop import no_reward_stop
from titanpod.rl.grpo.rewards import Reward, reward_name
from titanpod.rl.grpo.setup import GRPOSetup, prepare_grpo, rank_share, reference_model
from titanpod.rl.grpo.sharding import trainer_sharding
from titanpod.rl.grpo.signal_watch import SignalWatch
from titanpod.rl.grpo.trainer import GRPOTrainer
from titanpod.rl.rollout import BuiltinEngine, RolloutEngine
from titanpod.rl.rollout.engines import close_rollout, open_rollout
from titanpod.rl.rollout.streamed import sync_engine
from titanpod.runs.final_weights import write_final_weights
from titanpod.runs.hf_export import post_training_tokenizer, training_extras
from titanpod.runs.peer_loss import say_anywhere
from titanpod.runs.placement import Placement
from titanpod.runs.pretrain import describe_step
from titanpod.runs.session import RunSession

PRINTED_REWARD_ERRORS = 5
"""Reward errors a run prints in full; later ones are only counted (and kept in metrics.jsonl)."""


def run_grpo(recipe: GRPORecipe, console: Console | None = None, *, reward: Reward | None = None) -> GRPOResult:
    """GRPO from the SFT model of ``model.init_from``; held-out accuracy before and after; write the run.

    ``reward`` (prompt, completion text, answer) -> float replaces the reward the recipe picks
    (``grpo.reward_function``, else ``grpo.reward``). Everything is loaded and checked before the run directory
    is written.
    """
    started = time.perf_counter()
    setup = prepare_grpo(recipe, reward)
    with RunSession(recipe, setup.backend, console) as session:
        if session.is_main:
            setup.tokenizer.save(session.run_dir)
        reference = reference_model(setup)
        rows = recipe.grpo.prompts_per_step // setup.data_ranks * recipe.grpo.group_size
        # Every rank: the built-in engine is filled by a streamed sync from the (sharded) policy.
        engine = open_rollout(recipe.rollout, setup.model, rows, session.say, family=setup.family, device=setup.device)
        try:
            result = train_grpo(setup, session, engine, reference)
        finally:
            close_rollout(engine)
    result.run_seconds = time.perf_counter() - started
    return result


def skipped_line(metrics: GRPOStepMetrics, reward: str) -> str:
    """The line a step whose reward raised on some samples prints: how many, and what became of them."""
    return (
        f"the reward function {reward} raised on {metrics.skipped} of the step's {metrics.samples} completions; "
        "they were left out of the update (not scored 0); the step's first messages are in metrics.jsonl's "
        "reward_errors"
    )


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
    sharding, placement = trainer_sharding(setup.placement, setup.device), setup.placement
    objective = GRPOObjective(policy, recipe.grpo.clip_eps, recipe.grpo.kl_beta, recipe.grpo.temperature)
    step = build_step(objective, train, setup.backend)
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
    resumed_with_scores = start > 0 and session.is_main and held_out.keep_earlier(session.run_dir, "before")
    if recipe.eval.before and session.is_main and not resumed_with_scores:
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
        draw_reward_plot(session.run_dir, f"{session.run_dir.name}: GRPO on {setup.task.name}")
    session.draw_loss_plot()
    result.weights_path = session.save_final_weights(summary, lambda: write_model(setup, placement, result, say))
    return result


def run_steps(
    setup: GRPOSetup, session: RunSession, trainer: GRPOTrainer, result: GRPOResult, flops_per_token: float
) -> TrainSummary:
    """GRPO steps from the resumed one to ``train.stop_at_step`` (or ``train.steps``), driven by
    ``titanpod.graph.step_driver.drive_steps`` (signals, the stop on a non-finite step, the profiler); metrics
    and interval checkpoints. The summary counts the tokens of every update (``flops_per_token`` each) for
    throughput and MFU."""
    recipe, train, say = setup.recipe, setup.recipe.train, session.say
    start, last = session.start_step, train.stop_at_step or train.steps
    tokens_per_step = recipe.grpo.prompts_per_step * recipe.grpo.group_size * setup.plan.sequence_length
    tokens_per_step *= recipe.grpo.updates_per_step
    losses: list[float] = []
    skipped_steps: list[int] = []
    shown_errors = 0
    meter = ThroughputMeter()
    watch = SignalWatch(recipe.grpo.prompts_per_step)
    reward_stops: dict[int, str | None] = {}

    def run_step(step_number: int) -> Callable[[], StepCheck]:
        nonlocal shown_errors
        try:
            metrics = trainer(step_number)
        except RewardStop as stop:  # nothing of the step was trained: it does not count, and the run stops
            reward_stops[step_number] = f"step {step_number} (not trained on; the run stopped): {stop}"
            if not session.is_main and not isinstance(stop, PeerRewardStop):  # rank 0 cannot name this rank's sample
                say_anywhere(f"rank {session.info.rank}: {reward_stops[step_number]}")
            return lambda: StepCheck(True, None, None)
        setup.plan.steps_done = step_number
        meter.step_done(tokens_per_step, first=step_number == start + 1)
        for message in metrics.reward_errors:
            if shown_errors < PRINTED_REWARD_ERRORS:
                shown_errors += 1
                say(f"[yellow]step {step_number}: {escape(message)}; sample skipped[/]")
        if 0 < metrics.skipped < metrics.samples:  # a whole step is the stop's to say
            say(f"[yellow]step {step_number}: {escape(skipped_line(metrics, reward_name(setup.reward)))}[/]")
        result.history.append(metrics)
        reward_stops[step_number] = no_reward_stop(metrics, reward_name(setup.reward))
        result.skipped_samples += metrics.skipped
        result.weights_version, result.checksum = metrics.weights_version, metrics.checksum
        losses.append(math.nan if metrics.loss is None else metrics.loss)
        if metrics.skipped_updates:
            skipped_steps.append(step_number)
        write_step(session, metrics)
        if step_number % train.log_every == 0 or step_number == last:
            say(metrics.line())
        if (warning := watch.see(metrics)) is not None:
            say(f"[yellow]{escape(warning)}[/]")
        return lambda: StepCheck(not metrics.skipped_updates, metrics.loss, metrics.grad_norm)

    def after_step(step_number: int) -> None:
        if session.save_due(step_number):
            session.save_checkpoint(step_number)
        session.saves.poll()

    def stop_reason(step_number: int) -> str | None:
        return reward_stops.get(step_number) or session.saves.stop_reason(step_number)

    outcome = drive_steps(
        run_step,
        start + 1,
        last,
        setup.backend,
        skip_nonfinite=train.skip_nonfinite,
        after_step=after_step,
        profiler=session.profiler,  # profile.steps: traced from rollouts to update
        stop_reason=stop_reason,  # a reward the run cannot go on after, a step where every reward raised, or a
        # checkpoint folder no longer writable
    )
    end = time.perf_counter()
    if outcome.stopped_because is not None:
        say(f"[red]{escape(outcome.stopped_because)}[/]")
    result.stopped_because = outcome.stopped_because
    tokens_per_second = meter.overall(end)
    backend = setup.backend
    chip = backend.chip()
    return TrainSummary(
        steps_done=setup.plan.steps_done,
        losses=losses,
        tokens_per_second=tokens_per_second,
        mfu=MfuGauge(chip, flops_per_token, session.devices)(tokens_per_second),
        peak_method=chip.peak_method,
        peak_memory_gib=backend.memory_stats(session.info.local_rank).peak_gib,
        wall_seconds=end - meter.started,
        interrupted=outcome.interrupted,
        stop_signal=outcome.stop_signal,
        stopped_at_once=outcome.stopped_at_once,
        stop_received_at=outcome.stop_received_at,
        skipped_steps=skipped_steps,
        stopped_because=outcome.stopped_because,
        start_step=start,
    )


def write_model(setup: GRPOSetup, placement: Placement, result: GRPOResult, say: Callable[[str], None]) -> Path:
    """Write the trained policy to ``<run>/model`` with the recipe and tokenizer; with ``checkpoint.export_hf``
    also as a Hugging Face checkpoint in ``<run>/hf``. Every rank calls it: a sharded policy is gathered one
    tensor at a time and rank 0 writes. Returns the weights file."""
    recipe, steps = setup.recipe, setup.plan.steps_done
    extras = training_extras(
        recipe.to_dict(),
        setup.family,
        parameter_count(setup.model),
        steps,
        tokenizer=post_training_tokenizer(setup.tokenizer),
        notes=[f"Post-trained with GRPO from {public_name(recipe.model.init_from)}."],
        accuracy=result.after.accuracy if result.after is not None else None,
        accuracy_task=result.eval_task,
    )
    written = write_final_weights(
        placement,
        setup.family,
        result.run_dir,
        steps,
        recipe.to_json(),
        extras,
        recipe.checkpoint.export_hf,
        say,
        recipe.kernels.window,
    )
    result.hf_path = written.hf
    return written.weights
