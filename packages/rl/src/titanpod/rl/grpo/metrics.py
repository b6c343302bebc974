"""What one GRPO step reports: its rollouts, its updates and its weight sync, as typed figures."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from titanpod.rl.grpo.rewards import ScoredRollouts


@dataclass(frozen=True)
class RolloutTotals:
    """Sums over a step's rollouts (one data rank's, or every rank's added together)."""

    samples: int
    """Completions sampled."""
    skipped: int
    """Completions whose reward failed (left out of the update)."""
    reward_sum: float
    """Sum of the kept completions' rewards."""
    exact: int
    """Kept completions with reward 1 (the exact answer)."""
    completion_tokens: int
    """Completion tokens of the kept completions."""
    zero_signal_groups: int
    """Prompts whose kept samples all earned the same reward."""
    stopped: int = 0
    """Processes whose scoring ended in a ``RewardStop`` (the step is then not trained on, and the run stops)."""

    @property
    def kept(self) -> int:
        """Completions that take part in the update."""
        return self.samples - self.skipped

    @classmethod
    def of(cls, scored: ScoredRollouts) -> RolloutTotals:
        """The totals of ``scored``."""
        kept = [r for r in scored.rewards if r is not None]
        return cls(
            samples=len(scored.rewards),
            skipped=len(scored.rewards) - len(kept),
            reward_sum=float(sum(kept)),
            exact=sum(r == 1.0 for r in kept),
            completion_tokens=scored.completion_tokens,
            zero_signal_groups=scored.zero_signal_groups,
            stopped=int(scored.stop is not None),
        )

    def as_list(self) -> list[float]:
        """The fields as numbers, in order (for adding over ranks)."""
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_list(cls, values: list[float]) -> RolloutTotals:
        """The inverse of ``as_list`` (counts rounded back to integers)."""
        named = dict(zip([f.name for f in fields(cls)], values, strict=True))
        return cls(**{name: value if name == "reward_sum" else round(value) for name, value in named.items()})


@dataclass(frozen=True)
class UpdateFigures:
    """What a step's optimizer updates report, over every data rank."""

    loss: float | None
    """The GRPO loss of the last update (None when nothing was trained: every sample left out)."""
    kl: float | None
    """The k3 KL to the reference, averaged over the updates (None without a KL term or without updates)."""
    clip_fraction: float
    """Share of completion tokens whose ratio was clipped, averaged over the updates."""
    grad_norm: float | None
    """Gradient norm before clipping of the last update."""
    skipped_updates: int
    """Updates not applied because the gradient norm was NaN or Inf."""


@dataclass(frozen=True)
class GRPOStepMetrics:
    """One GRPO step's figures: one line of metrics.jsonl."""

    step: int
    """The GRPO step (1-based)."""
    reward_mean: float
    """Mean reward of the kept completions (0 when none was kept)."""
    accuracy: float
    """Share of kept completions that earned reward 1."""
    completion_length: float
    """Mean length of the kept completions, in tokens."""
    loss: float | None
    """See ``UpdateFigures.loss``."""
    kl: float | None
    """See ``UpdateFigures.kl``."""
    clip_fraction: float
    """See ``UpdateFigures.clip_fraction``."""
    grad_norm: float | None
    """See ``UpdateFigures.grad_norm``."""
    lr: float
    """Learning rate of the step's updates."""
    zero_signal_groups: int
    """Prompts whose kept samples all earned the same reward (no learning signal)."""
    samples: int
    """Completions sampled."""
    skipped: int
    """Completions whose reward failed (left out of the update)."""
    skipped_updates: int
    """Updates not applied because the gradient norm was NaN or Inf."""
    reward_errors: tuple[str, ...]
    """The first messages of completions whose reward failed (this process's)."""
    sync_seconds: float
    """Wall time of the weight sync into the rollout engine."""
    sync_bytes: int
    """Bytes of weights the sync sent to the engine (in the engine's dtype)."""
    weights_version: int
    """The engine's weights version after the sync (the step)."""
    checksum: str
    """The weights' checksum, equal on the trainer and the engine."""
    rollout_seconds: float
    """Wall time of the step's rollouts: sampling and scoring."""
    rollout_tokens_per_second: float
    """Completion tokens the engine sampled per second of ``rollout_seconds`` (this process's)."""
    update_seconds: float
    """Wall time of the step's updates."""
    update_tokens_per_second: float
    """Tokens the updates trained on (rows x padded length x updates) per second of ``update_seconds``."""
    step_seconds: float
    """Wall time of the step: rollouts, updates and sync."""
    step_cpu_seconds: float
    """CPU time of the step (user + system, every thread of this process and its waited-for children): what the
    step costs the machine, which the load of other jobs does not inflate the way it inflates ``step_seconds``.
    Engines in processes of their own (``rollout.mode`` ray or vllm) are not counted: compare it only between
    in-process engines."""

    @classmethod
    def build(cls, step: int, totals: RolloutTotals, updates: UpdateFigures, lr: float, **rest: Any) -> GRPOStepMetrics:
        """The metrics of step ``step`` from its rollout totals and update figures; ``rest`` gives the other fields."""
        kept = totals.kept
        return cls(
            step=step,
            reward_mean=totals.reward_sum / kept if kept else 0.0,
            accuracy=totals.exact / kept if kept else 0.0,
            completion_length=totals.completion_tokens / kept if kept else 0.0,
            loss=updates.loss,
            kl=updates.kl,
            clip_fraction=updates.clip_fraction,
            grad_norm=updates.grad_norm,
            lr=lr,
            zero_signal_groups=totals.zero_signal_groups,
            samples=totals.samples,
            skipped=totals.skipped,
            skipped_updates=updates.skipped_updates,
            **rest,
        )

    def record(self) -> dict[str, Any]:
        """Every field, for metrics.jsonl (``None`` where a figure does not apply)."""
        row = asdict(self)
        row["reward_errors"] = list(self.reward_errors)
        return row

    def logged(self) -> dict[str, float]:
        """The numeric figures that apply, for scalar writers (TensorBoard)."""
        return {
            name: value
            for name, value in asdict(self).items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }

    def line(self) -> str:
        """One console line."""
        kl = "-" if self.kl is None else f"{self.kl:.4f}"
        loss = "-" if self.loss is None else f"{self.loss:.4f}"
        return (
            f"step {self.step:4d}  reward {self.reward_mean:.3f}  acc {self.accuracy:.3f}  "
            f"len {self.completion_length:.1f}  loss {loss}  kl {kl}  clip {self.clip_fraction:.3f}  "
            f"flat groups {self.zero_signal_groups}  skipped {self.skipped}  "
            f"sync {self.sync_seconds * 1000:.0f} ms {self.sync_bytes / 2**20:.1f} MiB "
            f"v{self.weights_version} {self.checksum[:8]}  "
            f"rollouts {self.rollout_tokens_per_second:,.0f} tok/s, "
            f"updates {self.update_tokens_per_second:,.0f} tok/s  "
            f"{self.step_seconds:.2f} s ({self.step_cpu_seconds:.2f} s CPU)"
        )
