"""The eager training loop on a tiny model."""

import itertools
import os
import signal
import threading

import pytest
import torch

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.models import DecoderArgs, Transformer

TINY = DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=16, ffn_dim=48, max_seq_len=32)


def tiny_model() -> Transformer:
    with torch.device("meta"):
        model = Transformer(TINY)
    model.to_empty(device="cpu")
    model.init_weights(0)
    return model


def repeating_batches():
    """A fixed pattern the model can learn: token i is followed by i + 1 (mod 16)."""
    sequence = torch.arange(17) % 16
    batch = sequence.expand(4, 17)
    return itertools.repeat((batch[:, :-1], batch[:, 1:]))


def test_loss_falls_and_reports_arrive_every_log_interval():
    reports = []
    config = TrainConfig(steps=30, lr=1e-2, warmup_steps=2, log_every=10, grad_clip=1.0)
    summary = train(
        tiny_model(), repeating_batches(), config, get_backend("cpu"), flops_per_token=1e6, on_report=reports.append
    )
    assert summary.steps_done == 30 and len(summary.losses) == 30
    assert summary.losses[-1] < 0.5 * summary.losses[0]
    assert [r.step for r in reports] == [10, 20, 30]
    assert reports[0].loss == pytest.approx(sum(summary.losses[:10]) / 10)
    assert reports[-1].lr == pytest.approx(config.lr * config.min_lr_ratio)
    assert summary.tokens_per_second > 0 and summary.mfu > 0
    assert not summary.interrupted


def test_same_seed_same_losses():
    config = TrainConfig(steps=5, warmup_steps=1, log_every=5)
    first = train(tiny_model(), repeating_batches(), config, get_backend("cpu"), flops_per_token=1.0)
    second = train(tiny_model(), repeating_batches(), config, get_backend("cpu"), flops_per_token=1.0)
    assert first.losses == second.losses


def test_ctrl_c_finishes_the_step_in_flight_then_stops():
    def ctrl_c_during(step_index):
        for index, batch in enumerate(repeating_batches()):
            if index == step_index:
                os.kill(os.getpid(), signal.SIGINT)
            yield batch

    config = TrainConfig(steps=20, warmup_steps=1, log_every=4)
    before = signal.getsignal(signal.SIGINT)  # pytest's; ignored where the tests run as a shell's background job
    summary = train(tiny_model(), ctrl_c_during(5), config, get_backend("cpu"), flops_per_token=1.0)
    assert summary.interrupted
    assert summary.steps_done == 6 and len(summary.losses) == 6
    assert signal.getsignal(signal.SIGINT) is before  # the handler the run found is back


def signals_during(step_index, *signums):
    """Batches that send ``signums`` to this thread, one after the other, while fetching batch ``step_index``
    (``pthread_kill`` runs each handler before it returns, so two signals never merge into one)."""
    for index, batch in enumerate(repeating_batches()):
        if index == step_index:
            for signum in signums:
                signal.pthread_kill(threading.get_ident(), signum)
        yield batch


def test_sigterm_finishes_the_step_in_flight_then_stops_and_says_so():
    config = TrainConfig(steps=20, warmup_steps=1, log_every=4)
    batches = signals_during(5, signal.SIGTERM)
    before = signal.getsignal(signal.SIGTERM)
    summary = train(tiny_model(), batches, config, get_backend("cpu"), flops_per_token=1.0)
    assert summary.interrupted and summary.stop_signal == signal.SIGTERM and not summary.stopped_at_once
    assert summary.steps_done == 6 and len(summary.losses) == 6
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_signal_stops_at_once_and_marks_the_steps_state_unsafe_to_save():
    config = TrainConfig(steps=20, warmup_steps=1, log_every=4)
    batches = signals_during(5, signal.SIGTERM, signal.SIGINT)  # inside step 6, its batch being fetched
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    summary = train(tiny_model(), batches, config, get_backend("cpu"), flops_per_token=1.0)
    assert summary.interrupted and summary.stopped_at_once and summary.stop_signal == signal.SIGINT
    assert summary.steps_done == 5
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_one_signal_delivered_twice_at_once_is_one_request():
    # A signal to the process group reaches the run directly and again through `uv run`, which forwards it.
    config = TrainConfig(steps=20, warmup_steps=1, log_every=4)
    batches = signals_during(5, signal.SIGTERM, signal.SIGTERM)
    summary = train(tiny_model(), batches, config, get_backend("cpu"), flops_per_token=1.0)
    assert summary.interrupted and summary.stop_signal == signal.SIGTERM and not summary.stopped_at_once
    assert summary.steps_done == 6 and len(summary.losses) == 6


def test_an_exception_out_of_the_data_stops_with_the_finished_steps():
    def broken_after(n):
        yield from itertools.islice(repeating_batches(), n)
        raise KeyboardInterrupt

    config = TrainConfig(steps=20, warmup_steps=1, log_every=4)
    summary = train(tiny_model(), broken_after(3), config, get_backend("cpu"), flops_per_token=1.0)
    assert summary.interrupted and summary.steps_done == 3
