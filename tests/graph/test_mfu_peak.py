"""MFU names the peak it divides by, and a figure above 100% comes with one warning saying how to fix the peak."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from titanpod.device import ChipSpec, get_backend
from titanpod.device.backends.cpu import CpuBackend
from titanpod.graph import MfuGauge, PeakTooLowWarning, StepMetrics, TensorBoardWriter, TrainConfig, train
from titanpod.models import DecoderArgs, Transformer
from titanpod.runs.summary_rows import mfu_text

TINY = DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=16, ffn_dim=48, max_seq_len=32)
MEASURED = ChipSpec("cpu", 1e9, 1 << 30, measured=True, peak_method="fp32 matmul measured on this machine (kept in X)")


class SlowChipBackend(CpuBackend):
    """The cpu lane with a peak far below what the model reaches: a figure measured on a busy machine."""

    def chip(self) -> ChipSpec:
        return ChipSpec("cpu", 1.0, 1 << 30, measured=True, peak_method="fp32 matmul measured on this machine")


def tiny_run(backend, steps: int = 3, flops_per_token: float = 1e6):
    with torch.device("meta"):
        model = Transformer(TINY)
    model.to_empty(device="cpu")
    model.init_weights(0)
    batch = (torch.arange(17) % 16).expand(2, 17)
    reports: list[StepMetrics] = []
    config = TrainConfig(steps=steps, lr=1e-2, warmup_steps=1, log_every=1)
    batches = itertools.repeat((batch[:, :-1], batch[:, 1:]))
    summary = train(model, batches, config, backend, flops_per_token=flops_per_token, on_report=reports.append)
    return summary, reports


def test_a_figure_above_one_warns_once_naming_the_peak_and_the_fix():
    gauge = MfuGauge(MEASURED, flops_per_token=1e6, devices=1)
    with pytest.warns(PeakTooLowWarning) as caught:
        assert gauge(2_000) == pytest.approx(2.0)
        assert gauge(3_000) == pytest.approx(3.0)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "MFU 200% is above 100%" in message and "0.001 TFLOP/s per device" in message
    assert "fp32 matmul measured on this machine (kept in X)" in message
    assert "measure it again on an idle machine" in message


def test_a_datasheet_peak_points_at_the_chip_table():
    gauge = MfuGauge(ChipSpec("h100", 1e9, 1 << 30), flops_per_token=1e6, devices=1)
    with pytest.warns(PeakTooLowWarning, match=r"titanpod\.device\.CHIPS"):
        gauge(5_000)


def test_a_figure_at_most_one_is_quiet():
    gauge = MfuGauge(MEASURED, flops_per_token=1e6, devices=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gauge(2_000) == pytest.approx(1.0)
    assert not gauge.warned


def test_the_loop_warns_once_and_the_summary_and_first_report_name_the_peak():
    with pytest.warns(PeakTooLowWarning) as caught:
        summary, reports = tiny_run(SlowChipBackend())
    assert len([w for w in caught if issubclass(w.category, PeakTooLowWarning)]) == 1
    assert summary.mfu > 1 and summary.peak_method == "fp32 matmul measured on this machine"
    assert "above 100%" in mfu_text(summary) and "fp32 matmul measured on this machine" in mfu_text(summary)
    assert reports[0].mfu_peak == "1e-12 TFLOP/s per device: fp32 matmul measured on this machine"
    assert all(report.mfu_peak is None for report in reports[1:])


def test_a_run_against_this_machine_s_kept_peak_stays_at_most_one_and_says_how_it_was_found():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PeakTooLowWarning)
        summary, reports = tiny_run(get_backend("cpu"), flops_per_token=Transformer(TINY).flops_per_token(16))
    assert 0 < summary.mfu <= 1
    assert summary.peak_method.startswith("fp32 matmul measured on this machine")
    assert reports[0].mfu_peak is not None and "fp32 matmul measured on this machine" in reports[0].mfu_peak


def test_tensorboard_leaves_the_words_out(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = TensorBoardWriter(tmp_path / "tb")
    writer.write(StepMetrics(1, 2.5, 1.0, 1e-3, 100.0, 0.1, 0.25, 1.0, 3.0, mfu_peak="1 TFLOP/s per device: words"))
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert "train/mfu" in events.Tags()["scalars"] and "train/mfu_peak" not in events.Tags()["scalars"]
