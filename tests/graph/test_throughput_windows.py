"""Throughput and MFU are one running figure (``titanpod.graph.throughput``): every report gives the tokens of the
steps after the first over the time since the first step ended, and the summary is the last report's figure."""

import itertools

import pytest
import torch

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.models import DecoderArgs, Transformer

TINY = DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=16, ffn_dim=48, max_seq_len=32)
BATCH, SEQUENCE = 4, 16
STEP_TOKENS = BATCH * SEQUENCE
FLOPS = Transformer(TINY).flops_per_token(SEQUENCE)


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
    config = TrainConfig(steps=steps, lr=1e-2, warmup_steps=min(1, steps - 1), log_every=log_every)
    backend = get_backend("cpu")
    summary = train(tiny_model(), batches(), config, backend, flops_per_token=FLOPS, on_report=reports.append)
    return summary, reports


def first_step_end(report, step_tokens: int = STEP_TOKENS) -> float:
    """When the first step ended (seconds from the loop's start), as a report's own figures place it."""
    return report.elapsed_seconds - (report.step - 1) * step_tokens / report.tokens_per_second


def test_every_later_report_counts_from_the_first_step_s_end_and_the_summary_is_the_last():
    summary, reports = run(steps=6, log_every=1)
    assert [report.step for report in reports] == [1, 2, 3, 4, 5, 6]
    ends = [first_step_end(report) for report in reports[1:]]
    assert ends == pytest.approx([ends[0]] * 5, rel=1e-6)  # one starting point for every report
    assert 0 < ends[0] < reports[0].elapsed_seconds  # ...the first step's end, before the report of it
    # the report of step 1 alone: its tokens over its own time, as nothing else has run yet
    assert reports[0].tokens_per_second == pytest.approx(STEP_TOKENS / reports[0].elapsed_seconds, rel=0.05)
    assert summary.tokens_per_second == reports[-1].tokens_per_second
    assert summary.mfu == reports[-1].mfu
    per_token = reports[0].mfu / reports[0].tokens_per_second  # MFU follows the same figure
    assert [report.mfu for report in reports] == pytest.approx([r.tokens_per_second * per_token for r in reports])


def test_with_reports_every_few_steps_the_first_step_is_still_left_out():
    summary, reports = run(steps=7, log_every=3)
    assert [report.step for report in reports] == [3, 6, 7]
    ends = [first_step_end(report) for report in reports]
    assert ends == pytest.approx([ends[0]] * 3, rel=1e-6)
    assert 0 < ends[0] < reports[0].elapsed_seconds
    assert summary.tokens_per_second == reports[-1].tokens_per_second


def test_a_one_step_run_reports_that_step_in_the_report_and_the_summary_alike():
    summary, reports = run(steps=1, log_every=1)
    assert len(reports) == 1 and reports[0].tokens_per_second > 0
    assert summary.tokens_per_second == reports[0].tokens_per_second
