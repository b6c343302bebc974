"""One GRPO step: rollouts of this rank's prompts, rewards and advantages, ``grpo.updates_per_step`` graph
steps on the same rollouts, and the verified weight sync into the engine."""

from __future__ import annotations

import time

import torch

from titanpod.graph import StepOutput, TrainStep, lr_multiplier
from titanpod.models import Transformer
from titanpod.rl.grpo.batches import build_batch, token_weight, with_policy_logprobs
from titanpod.rl.grpo.cpu_time import process_cpu_seconds
from titanpod.rl.grpo.metrics import GRPOStepMetrics, RolloutTotals, UpdateFigures
from titanpod.rl.grpo.objective import CLIP_FRACTION, KL, token_logprobs
from titanpod.rl.grpo.prompts import PromptShare
from titanpod.rl.grpo.reward_call import PeerRewardStop, RewardStop
from titanpod.rl.grpo.rewards import ScoredRollouts, reward_name, score_rollouts
from titanpod.rl.grpo.setup import GRPOSetup
from titanpod.rl.grpo.sharding import TrainerSharding
from titanpod.rl.rollout import BuiltinEngine, Completion, RolloutEngine, SamplingParams
from titanpod.rl.rollout.streamed import sync_engine

SHOWN_REWARD_ERRORS = 5
"""Reward errors a step's metrics keep in full; later ones are only counted."""


class GRPOTrainer:
    """Runs GRPO steps of ``setup`` with ``step`` (over the GRPO objective of ``setup.model``) and ``engine``."""

    def __init__(
        self,
        setup: GRPOSetup,
        engine: RolloutEngine,
        step: TrainStep,
        sharding: TrainerSharding,
        share: PromptShare,
        reference: Transformer | None = None,
    ) -> None:
        """``share`` is this rank's block of each step's prompts; ``reference`` the frozen starting model (KL)."""
        if share.start and not isinstance(engine, BuiltinEngine):
            raise ValueError("A rank sampling part of a step's prompts needs a BuiltinEngine (rollout.mode local).")
        self.setup, self.engine, self.step, self.sharding = setup, engine, step, sharding
        self.share, self.reference = share, reference

    def sampling_params(self, step_number: int) -> SamplingParams:
        """How step ``step_number``'s completions are sampled (its seed depends on the step alone)."""
        config = self.setup.recipe.grpo
        return SamplingParams(
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            stop_token_ids=self.setup.tokenizer.stop_ids,
            seed=self.setup.plan.sampling_seed(step_number),
            n=config.group_size,
        )

    def rollouts(self, step_number: int) -> ScoredRollouts:
        """This rank's completions of step ``step_number``, scored (prompt indices count in the whole step)."""
        prompts = self.setup.plan.prompts(step_number)
        mine = prompts.prompt_ids[self.share.start : self.share.stop]
        params = self.sampling_params(step_number)
        completions: list[Completion]
        if isinstance(self.engine, BuiltinEngine):
            completions = self.engine.generate(mine, params, first_prompt_index=self.share.start)
        else:
            completions = self.engine.generate(mine, params)
        texts = [self.setup.tokenizer.decode(c.token_ids) for c in completions]
        timeout_s = self.setup.recipe.grpo.reward_timeout_s
        return score_rollouts(prompts.examples, completions, texts, self.setup.reward, timeout_s=timeout_s)

    def update(self, scored: ScoredRollouts, step_tokens: int, lr: float) -> UpdateFigures:
        """``grpo.updates_per_step`` training steps on ``scored`` (``step_tokens``: kept completion tokens of the
        whole step, every rank); nothing when no token is kept."""
        recipe = self.setup.recipe
        if step_tokens == 0:
            return UpdateFigures(loss=None, kl=None, clip_fraction=0.0, grad_norm=None, skipped_updates=0)
        micro = recipe.train.grad_accum_steps
        weight = token_weight(step_tokens, micro, self.sharding.data_ranks)
        device = self.setup.device
        reference = self.reference
        reference_logprobs = None
        temperature = recipe.grpo.temperature
        if reference is not None:

            def reference_logprobs(tokens_NL: torch.Tensor) -> torch.Tensor:
                return token_logprobs(reference, tokens_NL.to(device), temperature)

        batch = build_batch(
            scored, self.setup.plan.sequence_length, self.setup.tokenizer.pad_id, weight, reference_logprobs
        )
        if not getattr(self.engine, "logprobs_follow_temperature", True):
            policy = self.setup.model

            def policy_logprobs(tokens_NL: torch.Tensor) -> torch.Tensor:
                return token_logprobs(policy, tokens_NL.to(device), temperature)

            batch = with_policy_logprobs(batch, policy_logprobs)
        micro_batches = batch.to(device).micro_batches(micro)
        outputs: list[StepOutput] = [self.step(micro_batches, lr) for _ in range(recipe.grpo.updates_per_step)]
        clip = [float(self.sharding.mean(out.metrics[CLIP_FRACTION])) / micro for out in outputs]
        kls = [float(self.sharding.mean(out.metrics[KL])) / micro for out in outputs if KL in out.metrics]
        return UpdateFigures(
            loss=float(self.sharding.mean(outputs[-1].loss)),
            kl=sum(kls) / len(kls) if kls else None,
            clip_fraction=sum(clip) / len(clip),
            grad_norm=float(outputs[-1].grad_norm),
            skipped_updates=sum(not bool(out.applied) for out in outputs),
        )

    def __call__(self, step_number: int) -> GRPOStepMetrics:
        """Run GRPO step ``step_number`` (1-based) and sync the engine to it as weights version ``step_number``.

        ``RewardStop`` on every process, before any update, when the reward failed past recovery on any of them
        (``titanpod.rl.grpo.rewards``): the step is not trained on.
        """
        started, cpu_started = time.perf_counter(), process_cpu_seconds()
        train = self.setup.recipe.train
        scored = self.rollouts(step_number)
        sampled = time.perf_counter()
        totals = self.sharding.sum_totals(RolloutTotals.of(scored))
        if scored.stop is not None:
            raise RewardStop(scored.stop)
        if totals.stopped:
            raise PeerRewardStop(
                f"the reward function {reward_name(self.setup.reward)} failed past recovery in {totals.stopped} "
                "other process(es) of the run (a hung call, a sys.exit, or a NaN or absurd reward); their output "
                "names the sample and the fix"
            )
        lr = train.lr * lr_multiplier(step_number, train)
        update_started = time.perf_counter()
        updates = self.update(scored, totals.completion_tokens, lr)
        updated = time.perf_counter()
        sync = sync_engine(self.setup.model, self.engine, step_number)
        rollout_seconds, update_seconds = sampled - started, updated - update_started
        sampled_tokens = sum(len(completion.token_ids) for completion in scored.completions)
        trained = len(scored.rewards) * self.setup.plan.sequence_length * self.setup.recipe.grpo.updates_per_step
        return GRPOStepMetrics.build(
            step_number,
            totals,
            updates,
            lr,
            reward_errors=tuple(scored.errors[:SHOWN_REWARD_ERRORS]),
            sync_seconds=sync.seconds,
            sync_bytes=sync.bytes,
            weights_version=sync.version,
            checksum=sync.checksum,
            rollout_seconds=rollout_seconds,
            rollout_tokens_per_second=sampled_tokens / rollout_seconds if rollout_seconds else 0.0,
            update_seconds=update_seconds,
            update_tokens_per_second=trained / update_seconds if updates.loss is not None and update_seconds else 0.0,
            step_seconds=time.perf_counter() - started,
            step_cpu_seconds=process_cpu_seconds() - cpu_started,
        )
