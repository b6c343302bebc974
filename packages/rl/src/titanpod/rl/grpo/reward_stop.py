"""The stop for a step that cannot teach anything: its reward function raised on every one of its samples.

A sample whose reward raised is left out of the update, so a passing fault of a remote judge costs a few
samples, not a long run. When that is every sample of a step, on every rank, the function is broken or what
it calls is gone (a judge that is never reached): the run stops after that step with the reward function named
and the fix, and exits non-zero, instead of going on with nothing to learn from. Rewards the run cannot go on
after at all (a hung call, a ``sys.exit``, NaN or an absurd size) stop it within the step instead
(``titanpod.rl.grpo.rewards``).
"""

from __future__ import annotations

from titanpod.rl.grpo.metrics import GRPOStepMetrics


def no_reward_stop(metrics: GRPOStepMetrics, reward_name: str) -> str | None:
    """The stop message when no sample of ``metrics``' step, on any rank, got a reward from ``reward_name``;
    ``None`` otherwise (counts are summed over ranks, so every rank agrees)."""
    if metrics.samples == 0 or metrics.skipped < metrics.samples:
        return None
    example = f" (e.g. {metrics.reward_errors[0]})" if metrics.reward_errors else ""
    return (
        f"step {metrics.step}: the reward function {reward_name} raised on every one of the step's "
        f"{metrics.samples} completions{example}, so the step had nothing to learn from and the run stopped. Fix "
        "the function (or bring back what it calls) so that it returns a finite float for every completion "
        "(e.g. 0.0 for a wrong one, 1.0 for a right one); one that raises on a few samples only has them skipped."
    )
