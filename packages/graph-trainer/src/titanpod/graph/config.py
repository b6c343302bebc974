"""The training part of a run's config."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    """How many steps, how fast to learn, and how often to report."""

    steps: int = 100
    """Optimizer steps to run."""
    lr: float = 3e-3
    """Peak learning rate, reached at the end of warmup."""
    warmup_steps: int = 10
    """Steps of linear warmup: warmup step k uses ``k / warmup_steps`` of ``lr``."""
    decay: str = "cosine"
    """Shape of the decay after warmup: ``cosine``, ``linear`` or ``constant``."""
    min_lr_ratio: float = 0.1
    """The learning rate at the last step, as a fraction of ``lr``."""
    weight_decay: float = 0.1
    """AdamW weight decay, applied to matrices only (not norms)."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.95
    """AdamW second-moment decay."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 turns clipping off (the norm is still logged)."""
    seed: int = 0
    """Seed for weight init and data order."""
    log_every: int = 10
    """Read losses back from the device and write metrics every this many steps."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"train.steps must be at least 1, got {self.steps}.")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"train.warmup_steps must be in [0, steps), got {self.warmup_steps} for {self.steps} steps."
            )
        if self.decay not in ("cosine", "linear", "constant"):
            raise ValueError(f"train.decay must be cosine, linear or constant, got {self.decay!r}.")
        if self.log_every < 1:
            raise ValueError(f"train.log_every must be at least 1, got {self.log_every}.")
