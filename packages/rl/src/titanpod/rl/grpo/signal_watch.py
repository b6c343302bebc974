"""Noticing when GRPO has stopped learning: every group's samples earned the same reward, step after step.

A group whose completions all earn one reward has zero advantages and adds nothing to the gradient. When
every group of several steps in a row is flat, the run goes on spending rollouts without moving the policy.
The usual causes, told apart by the reward: all samples right (the task is solved for this policy), all
wrong (the task is too hard for the starting model), or a mix of groups each identical within itself (the
policy collapsed to one completion per prompt, most often from too high a learning rate).
"""

from __future__ import annotations

from titanpod.rl.grpo.metrics import GRPOStepMetrics

FLAT_STEPS_BEFORE_WARNING = 3
"""Steps in a row with every group flat before the run says so."""


def no_signal_advice(accuracy: float, reward_mean: float) -> str:
    """What a run whose every group is flat should try, from its step's share of exact answers (reward 1)
    and mean reward."""
    if accuracy >= 1.0:
        return "every sample earned reward 1: the task is solved for this policy; stop, or give it harder prompts"
    if accuracy <= 0.0 and reward_mean == 0.0:
        return (
            "every sample earned reward 0: the task is too hard for the starting model; train the SFT start "
            "longer, raise --grpo.group-size or --grpo.temperature, or use easier prompts"
        )
    return (
        "each prompt's samples earn one reward between them: most often the policy has collapsed to one "
        "completion per prompt; lower --train.lr, raise --grpo.temperature, or add a KL term (--grpo.kl-beta)"
    )


class SignalWatch:
    """Counts steps in a row whose every group was flat and gives one warning when they reach ``steps``."""

    def __init__(self, prompts_per_step: int, steps: int = FLAT_STEPS_BEFORE_WARNING) -> None:
        """``prompts_per_step``: the groups of a whole step (every rank's)."""
        self.prompts_per_step, self.steps = prompts_per_step, steps
        self.flat_run = 0
        """Steps in a row, up to the last one seen, whose every group was flat."""
        self.warned = False

    def see(self, metrics: GRPOStepMetrics) -> str | None:
        """The warning to print after ``metrics``' step, once per run; ``None`` otherwise."""
        flat = metrics.zero_signal_groups >= self.prompts_per_step
        self.flat_run = self.flat_run + 1 if flat else 0
        if self.warned or self.flat_run < self.steps:
            return None
        self.warned = True
        return (
            f"step {metrics.step}: every group of the last {self.flat_run} steps earned one reward per group "
            f"(no learning signal; mean reward {metrics.reward_mean:.3f}): "
            f"{no_signal_advice(metrics.accuracy, metrics.reward_mean)}"
        )
