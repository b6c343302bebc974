"""Throughput and MFU are measured one way: the summary's figure is the reports' figure over the same steps,
and neither counts the first step (it compiles and warms up)."""

import itertools

import pytest
import torch

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.models import DecoderArgs, Transformer

TINY = DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=16, ffn_dim=48, max_seq_len=32)
BATCH, SEQUENCE = 4, 16
STEP_TOKENS = BATCH * SEQUENCE


def tiny_model() -> Transformer:
    with torch.device("meta"):
        model = Transformer(TINY)
    model.to_empty(device="cpu")
    model.init_weights(0)
    return model


def batches():
    sequence = torch.arange(SEQUENCE + 1) % 16
    batch = sequence.expand(BATCH, SEQUENCE + 1)
    return itertools.repeat((batch[:, :-1], batch[:, 1:]))


def run(steps: int, log_every: int):
    reports = []
    config = TrainConfig(steps=steps, lr=1e-2, warmup_steps=1, log_every=log_every)
    summary = train(tiny_model(), batches(), config, get_backend("cpu"), flops_per_token=1e6, on_report=reports.append)
    return summary, reports


def test_with_a_report_every_step_the_summary_is_the_reports_after_the_first_weighted_by_their_time():
    summary, reports = run(steps=6, log_every=1)
    assert [report.step for report in reports] == [1, 2, 3, 4, 5, 6]
    # each later report's window runs from the previous report to its own
    windows = [later.elapsed_seconds - earlier.elapsed_seconds for earlier, later in itertools.pairwise(reports)]
    tokens = [report.tokens_per_second * seconds for report, seconds in zip(reports[1:], windows, strict=True)]
    assert tokens == pytest.approx([STEP_TOKENS] * 5, rel=1e-6)  # one step each, the first step in none of them
    assert summary.tokens_per_second == pytest.approx(sum(tokens) / sum(windows), rel=1e-9)
    mfu_over_time = sum(report.mfu * seconds for report, seconds in zip(reports[1:], windows, strict=True))
    assert summary.mfu == pytest.approx(mfu_over_time / sum(windows), rel=1e-9)


def test_the_first_window_starts_after_the_first_step_as_the_summary_does():
    summary, reports = run(steps=7, log_every=3)
    assert [report.step for report in reports] == [3, 6, 7]
    steps_counted = [2, 3, 1]  # steps 2-3 (step 1 left out), 4-6, 7
    first_window = steps_counted[0] * STEP_TOKENS / reports[0].tokens_per_second
    later_windows = [later.elapsed_seconds - earlier.elapsed_seconds for earlier, later in itertools.pairwise(reports)]
    later_tokens = [
        report.tokens_per_second * seconds for report, seconds in zip(reports[1:], later_windows, strict=True)
    ]
    assert later_tokens == pytest.approx([count * STEP_TOKENS for count in steps_counted[1:]], rel=1e-6)
    assert first_window < reports[0].elapsed_seconds  # step 1's time is not in the first window
    windows = [first_window, *later_windows]
    assert summary.tokens_per_second == pytest.approx(sum(steps_counted) * STEP_TOKENS / sum(windows), rel=1e-9)
    mfu_over_time = sum(report.mfu * seconds for report, seconds in zip(reports, windows, strict=True))
    assert summary.mfu == pytest.approx(mfu_over_time / sum(windows), rel=1e-9)
