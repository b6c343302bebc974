"""Training metrics: MFU, a JSONL log, and the numbers of one report."""

from __future__ import annotations

import json
import struct
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from titanpod.device import ChipSpec
from titanpod.graph.metrics_rows import encode_row, set_aside_rows_after


def mfu(flops_per_token: float, tokens_per_second: float, devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' summed peak.

    ``flops_per_token x tokens_per_second / (devices x peak_flops_per_device)``, with
    ``tokens_per_second`` counted over the whole job (every data shard). See
    ``titanpod.models.decoder_flops_per_token`` for what the FLOPs count.
    """
    return flops_per_token * tokens_per_second / (devices * peak_flops_per_device)


class PeakTooLowWarning(RuntimeWarning):
    """An MFU above 100%: the peak it divides by is too low (or the FLOPs counted per token too many)."""


class MfuGauge:
    """MFU of one loop against ``chip``'s peak, with one warning the first time a figure passes 100%."""

    def __init__(self, chip: ChipSpec, flops_per_token: float, devices: int) -> None:
        self.chip = chip
        """The device whose ``peak_flops`` (and ``peak_method``) MFU is measured against."""
        self.flops_per_token = flops_per_token
        """Model FLOPs per token (every token of the job)."""
        self.devices = devices
        """Devices the job's tokens run on."""
        self.warned = False
        """True once the warning was given."""

    def __call__(self, tokens_per_second: float) -> float:
        """``mfu`` of ``tokens_per_second``; a ``PeakTooLowWarning`` the first time it is above 1."""
        value = mfu(self.flops_per_token, tokens_per_second, self.devices, self.chip.peak_flops)
        if value > 1 and not self.warned:
            self.warned = True
            warnings.warn(above_peak_message(value, self.chip), PeakTooLowWarning, stacklevel=2)
        return value


def above_peak_message(value: float, chip: ChipSpec) -> str:
    """What an MFU of ``value`` (above 1) against ``chip`` means, and how to put it right."""
    if chip.measured:
        fix = (
            "It was likely measured while the machine was busy, or on other hardware: measure it again on an idle "
            "machine (delete the cached figure named above, then start a run)."
        )
    else:
        fix = "Check the chip's entry in titanpod.device.CHIPS and the model's FLOPs per token."
    return (
        f"MFU {value:.0%} is above 100%, so the peak it divides by, {chip.peak_flops / 1e12:.4g} TFLOP/s per "
        f"device, is too low. The peak: {chip.peak_method}. {fix}"
    )


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
    """Tokens trained per second, whole job, as of this report: the tokens of every step after the first over the
    time from the first step's end (``titanpod.graph.throughput``; the progress bar's and the summary's figure)."""
    tflops_per_second: float
    """Model TFLOP/s per device (as ``tokens_per_second``)."""
    mfu: float
    """Model FLOPs utilisation (as ``tokens_per_second``; 0..1 against a right peak)."""
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

    compile_seconds: float | None = None
    """The whole step's compile (or load from the compiled-step cache) inside the first step, in seconds; only in
    the first report of a run whose step inductor compiles (``None`` and left out of the logs otherwise)."""
    compile_cache_hit: bool | None = None
    """With ``compile_seconds``: whether the step was loaded from ``train.compile_cache_dir`` (False: compiled)."""
    mfu_peak: str | None = None
    """What MFU divides by, in words (``ChipSpec.peak_method`` with the figure); only in a run's first report."""
    program_memory_gib: float | None = None
    """The bytes a device the step's compiled program needs, as the compiler counts them (arguments, temporaries,
    outputs not aliased, code), in GiB; only in the first report of a run whose step is one XLA program."""
    estimated_step_seconds: float | None = None
    """The compiler's estimate of one step's time on the device (a TPU's ``optimal_seconds``), not a measurement;
    only in the first report, where the compiler gives one for the whole step (not with a layer scan)."""

    def logged(self) -> dict[str, Any]:
        """The fields as a dict, without those that do not apply (``None``)."""
        return {name: value for name, value in asdict(self).items() if value is not None}


class JsonlWriter:
    """Appends one JSON object per line, flushed at once so a crash loses nothing written.

    Lines are strict JSON: a NaN or Inf figure is written as ``null`` and named under ``"nonfinite"``
    (``titanpod.graph.metrics_rows``, whose ``read_row`` reads them back). The file is opened at the first line
    written, so a run that writes none (one refused before its first step) leaves no file behind."""

    def __init__(self, path: Path) -> None:
        self.path = path
        """The file the lines are appended to."""
        self._file: TextIO | None = None

    def write(self, record: StepMetrics | dict[str, Any]) -> None:
        """Append ``record`` as one line."""
        row = record.logged() if isinstance(record, StepMetrics) else record
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(encode_row(row) + "\n")
        self._file.flush()

    def set_aside_after(self, step: int) -> Path | None:
        """Move the rows past ``step`` (an earlier attempt's, past the checkpoint this run resumes) into a file
        beside this one (``set_aside_rows_after``), and go on appending; returns that file, or ``None``."""
        self.close()
        return set_aside_rows_after(self.path, step)

    def write_scalars(self, step: int, values: dict[str, float]) -> None:
        """Append ``values`` at ``step`` as one line (e.g. a validation loss)."""
        self.write({"step": step, **values})

    def close(self) -> None:
        """Close the file (the next line opens it again)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested recipe dict as dotted names (``train.lr``) to numbers, booleans and strings: what hyper-parameter
    tables take. ``None`` becomes ``"None"`` and a list its JSON text."""
    flat: dict[str, bool | int | float | str] = {}
    for name, value in config.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{key}."))
        elif isinstance(value, bool | int | float | str):
            flat[key] = value
        elif value is None:
            flat[key] = "None"
        else:
            flat[key] = json.dumps(value)
    return flat


PNG_COLOURS = {0: 1, 2: 3, 4: 2, 6: 4}
"""PNG colour type -> channels, as TensorBoard's image summary counts them (grey, RGB, grey + alpha, RGBA)."""


class TensorBoardWriter:
    """Writes each report's numbers as TensorBoard scalars (``train/loss``, ``train/mfu``, ...) at its step; also
    the recipe as text, its fields as hyper-parameters with the final figures as their metrics, and images."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for

        self.log_dir = log_dir
        """The folder of the event file, made at the first figure written (a run refused before its first step
        leaves none)."""
        self._make_writer = SummaryWriter
        self._opened: Any = None
        self._config: dict[str, Any] | None = None
        self._last_eval: dict[str, float] = {}

    @property
    def _writer(self) -> Any:
        """The event file's writer, opened at first use; the recipe (``write_config``) goes in first."""
        if self._opened is None:
            self._opened = self._make_writer(log_dir=str(self.log_dir))
            if self._config is not None:
                text = "```json\n" + json.dumps(self._config, indent=2) + "\n```"
                self._opened.add_text("recipe", text, 0)
        return self._opened

    def write(self, record: StepMetrics) -> None:
        """Add every field of ``record`` but ``step`` as a scalar at ``record.step``, and flush."""
        for name, value in record.logged().items():
            if name != "step" and isinstance(value, int | float):  # figures, not words (``mfu_peak``)
                self._writer.add_scalar(f"train/{name}", value, record.step)
        self._writer.flush()

    def write_scalars(self, step: int, values: dict[str, float]) -> None:
        """Add ``values`` as scalars at ``step`` under ``eval/`` (e.g. ``eval/validation_loss``), and flush."""
        for name, value in values.items():
            self._writer.add_scalar(f"eval/{name}", value, step)
        self._last_eval.update(values)
        self._writer.flush()

    def write_config(self, config: dict[str, Any]) -> None:
        """Add the recipe ``config`` as JSON text (tag ``recipe``, once the event file is open); its fields become
        the hyper-parameters ``write_summary`` records."""
        self._config = config
        if self._opened is not None:
            self._opened.add_text("recipe", "```json\n" + json.dumps(config, indent=2) + "\n```", 0)
            self._opened.flush()

    def write_image(self, step: int, name: str, path: Path) -> None:
        """Add the PNG file at ``path`` (a sample grid) as image ``name`` at ``step``, its bytes as they are."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        data = path.read_bytes()
        if data[:8] != b"\x89PNG\r\n\x1a\n":
            raise ValueError(f"{path} is not a PNG file; TensorBoard images are written from PNG files.")
        width, height = struct.unpack(">II", data[16:24])
        image = Summary.Image(height=height, width=width, colorspace=PNG_COLOURS[data[25]], encoded_image_string=data)
        self._writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=name, image=image)]), step)
        self._writer.flush()

    def write_summary(self, figures: dict[str, float]) -> None:
        """Record the recipe's fields (``write_config``) as hyper-parameters with ``figures`` and the last
        ``eval/`` figures as their metrics (``hparams/final_loss``, ``hparams/validation_loss`` ...)."""
        from torch.utils.tensorboard.summary import hparams

        metrics = {f"hparams/{name}": float(value) for name, value in {**figures, **self._last_eval}.items()}
        for summary in hparams(flat_config(self._config or {}), metrics):
            self._writer._get_file_writer().add_summary(summary)
        step = int(figures.get("steps_done", 0))
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (nothing when none was written)."""
        if self._opened is not None:
            self._opened.close()
