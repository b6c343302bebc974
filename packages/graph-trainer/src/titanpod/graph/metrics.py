"""Training metrics: MFU, a JSONL log, and the numbers of one report."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


def mfu(flops_per_token: float, tokens_per_second: float, devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' summed peak.

    ``flops_per_token x tokens_per_second / (devices x peak_flops_per_device)``, with
    ``tokens_per_second`` counted over the whole job. See
    ``titanpod.models.decoder_flops_per_token`` for what the FLOPs count.
    """
    return flops_per_token * tokens_per_second / (devices * peak_flops_per_device)


@dataclass(frozen=True)
class StepMetrics:
    """What one report says about the steps since the previous one."""

    step: int
    """Last optimizer step covered (1-based)."""
    loss: float
    """Mean training loss over the covered steps."""
    grad_norm: float
    """Global gradient norm before clipping, at ``step``."""
    lr: float
    """Learning rate used at ``step``."""
    tokens_per_second: float
    """Tokens trained per second over the covered steps, whole job."""
    tflops_per_second: float
    """Model TFLOP/s per device over the covered steps."""
    mfu: float
    """Model FLOPs utilisation over the covered steps (0..1)."""
    peak_memory_gib: float | None
    """Peak memory of this process's device so far (host RSS on a CPU); ``None`` (left out of the
    logs) where the device does not report it."""
    elapsed_seconds: float
    """Wall time since training started."""
    skipped_steps: int = 0
    """Steps skipped so far because their gradient norm was NaN or Inf."""
    dropped_tokens: int | None = None
    """Mixture-of-experts models: routed (token, expert) choices dropped because the expert's buffer
    was full (``MoEArgs.capacity_factor``), summed over layers, micro-batches, data shards and the
    covered steps; ``None`` (and left out of the logs) for models without experts."""

    def logged(self) -> dict[str, Any]:
        """The fields as a dict, without those that do not apply (``None``)."""
        return {name: value for name, value in asdict(self).items() if value is not None}


class JsonlWriter:
    """Appends one JSON object per line, flushed at once so a crash loses nothing written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: StepMetrics | dict[str, Any]) -> None:
        """Append ``record`` as one line."""
        row = record.logged() if isinstance(record, StepMetrics) else record
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def write_scalars(self, step: int, values: dict[str, float]) -> None:
        """Append ``values`` at ``step`` as one line (e.g. a validation loss)."""
        self.write({"step": step, **values})

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class TensorBoardWriter:
    """Writes each report's numbers as TensorBoard scalars (``train/loss``, ``train/mfu``, ...) at its step."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, record: StepMetrics) -> None:
        """Add every field of ``record`` but ``step`` as a scalar at ``record.step``, and flush."""
        for name, value in record.logged().items():
            if name != "step":
                self._writer.add_scalar(f"train/{name}", value, record.step)
        self._writer.flush()

    def write_scalars(self, step: int, values: dict[str, float]) -> None:
        """Add ``values`` as scalars at ``step`` under ``eval/`` (e.g. ``eval/validation_loss``), and flush."""
        for name, value in values.items():
            self._writer.add_scalar(f"eval/{name}", value, step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
