"""The stop for a run that cannot learn: its first step gave no completion a usable reward.

A sample whose reward raised or was not finite is left out of the update. When that is every sample of the
run's first step, on every rank, the reward function is broken rather than unlucky (a NaN for every
completion, a judge that is never reached): the run stops there with the reward function named and the
fix, and exits non-zero, instead of finishing with nothing updated. Later steps only skip such samples, so a
passing fault of a remote judge does not end a long run.
"""

from __future__ import annotations

from titanpod.rl.grpo.metrics import GRPOStepMetrics


def no_reward_stop(metrics: GRPOStepMetrics, first_step: int, reward_name: str) -> str | None:
    """The stop message when ``metrics`` is this run's ``first_step`` and no sample of it, on any rank, got a
    finite reward from ``reward_name``; ``None`` otherwise (counts are summed over ranks, so every rank agrees)."""
    if metrics.step != first_step or metrics.samples == 0 or metrics.skipped < metrics.samples:
        return None
    example = f" (e.g. {metrics.reward_errors[0]})" if metrics.reward_errors else ""
    return (
        f"step {metrics.step}: the reward function {reward_name} gave none of the step's {metrics.samples} "
        f"completions a finite reward{example}, so nothing can be learned and the run stopped with nothing "
        "updated. Fix the function to return a finite float for every completion (e.g. 0.0 for a wrong one, "
        "1.0 for a right one), never NaN or infinity, and to raise on none."
    )
