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


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_time_in_validation_and_saves_is_left_out_of_tokens_per_second():
    from titanpod.graph.throughput import ThroughputMeter

    clock = Clock()
    meter = ThroughputMeter(clock)
    with meter.outside_training():  # before the first step ends: nothing is timed yet, so nothing to leave out
        clock.now += 7.0
    clock.now += 2.0
    meter.step_done(STEP_TOKENS, first=True)
    for _ in range(3):  # three steps of 1 s, each followed by a 5 s save
        clock.now += 1.0
        meter.step_done(STEP_TOKENS, first=False)
        with meter.outside_training():
            clock.now += 5.0
    tokens_per_second, elapsed = meter.report()
    assert tokens_per_second == pytest.approx(3 * STEP_TOKENS / 3.0)
    assert elapsed == pytest.approx(7.0 + 2.0 + 3 * 6.0)  # wall time, saves included


def test_a_slow_after_step_hook_does_not_lower_the_reported_rate_in_a_run():
    import time

    hook_seconds = []

    def slow_save(step_number: int) -> None:
        began = time.perf_counter()
        time.sleep(0.3)
        hook_seconds.append(time.perf_counter() - began)

    reports = []
    config = TrainConfig(steps=4, lr=1e-2, warmup_steps=1, log_every=4)
    backend = get_backend("cpu")
    summary = train(tiny_model(), batches(), config, backend, flops_per_token=FLOPS, on_report=reports.append,
                    after_step=slow_save)  # fmt: skip
    # the hook ran after steps 1, 2 and 3 before the report (and after step 4, after it): the rate's seconds are
    # the elapsed time less the first step's and less those three calls
    (report,) = reports
    timed = 3 * STEP_TOKENS / report.tokens_per_second
    assert timed < report.elapsed_seconds - sum(hook_seconds[:3])
    assert summary.wall_seconds >= sum(hook_seconds)
