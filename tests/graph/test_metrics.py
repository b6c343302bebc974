"""MFU on a case computed by hand, and the JSONL log."""

import json

import pytest

from titanpod.graph import JsonlWriter, StepMetrics, TensorBoardWriter, mfu
from titanpod.models import DecoderArgs, Transformer


def test_mfu_hand_computed():
    # 6 x 8e9 FLOPs per token at 10,000 tokens/s on 8 devices of 1e15 FLOP/s peak:
    # 4.8e14 FLOP/s achieved over 8e15 available = 6%.
    assert mfu(6 * 8e9, 10_000, 8, 1e15) == pytest.approx(0.06)


def test_mfu_of_a_tiny_model_computed_by_hand():
    # dim 8, 2 heads of 4 (1 kv head), ffn 12, vocab 16, one layer, sequence 4.
    # Matmul parameters (all but the input embedding): wq 8x8=64, wk 4x8=32, wv 32, wo 64;
    # w1, w2, w3 3x(8x12)=288; two block norms 16 and the final norm 8; output head 16x8=128.
    # N = 64+32+32+64+288+16+8+128 = 632. FLOPs per token = 6 x 632 + 12 x 1 x 2 x 4 x 4
    # (attention: layers x heads x head dim x sequence) = 3792 + 384 = 4176.
    args = DecoderArgs(dim=8, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=16, ffn_dim=12, max_seq_len=4)
    assert Transformer(args).flops_per_token(4) == 4176
    # 1e6 tokens/s on 2 devices of 1e10 FLOP/s: 4.176e9 / 2e10.
    assert mfu(4176, 1e6, 2, 1e10) == pytest.approx(0.2088)


def test_tensorboard_writer_writes_scalars_tensorboard_reads(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = TensorBoardWriter(tmp_path / "tb")
    writer.write(StepMetrics(10, 2.5, 1.0, 1e-3, 100.0, 0.1, 0.25, 1.0, 3.0))
    writer.write(StepMetrics(20, 2.0, 0.5, 1e-3, 120.0, 0.1, 0.5, 1.0, 6.0, skipped_steps=1))
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(10, 2.5), (20, 2.0)]
    assert [e.value for e in events.Scalars("train/mfu")] == [0.25, 0.5]
    assert [e.value for e in events.Scalars("train/skipped_steps")] == [0, 1]


def test_jsonl_writer_appends_one_object_per_line(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    writer = JsonlWriter(path)
    writer.write(StepMetrics(10, 2.5, 1.0, 1e-3, 100.0, 0.1, 0.2, 1.0, 3.0))
    writer.write({"event": "done"})
    writer.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["step"] == 10 and rows[0]["loss"] == 2.5 and rows[0]["mfu"] == 0.2
    assert rows[1] == {"event": "done"}
    assert "dropped_tokens" not in rows[0]  # a model without experts: the field does not apply


def test_dropped_tokens_are_logged_when_the_model_reports_them(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = JsonlWriter(path)
    writer.write(StepMetrics(10, 2.5, 1.0, 1e-3, 100.0, 0.1, 0.2, 1.0, 3.0, dropped_tokens=0))
    writer.write(StepMetrics(20, 2.5, 1.0, 1e-3, 100.0, 0.1, 0.2, 1.0, 3.0, dropped_tokens=17))
    writer.close()
    assert [json.loads(line)["dropped_tokens"] for line in path.read_text().splitlines()] == [0, 17]
