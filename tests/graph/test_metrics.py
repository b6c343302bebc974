"""MFU on a case computed by hand, and the JSONL log."""

import json

import pytest

from titanpod.graph import JsonlWriter, StepMetrics, mfu


def test_mfu_hand_computed():
    # 6 x 8e9 FLOPs per token at 10,000 tokens/s on 8 devices of 1e15 FLOP/s peak:
    # 4.8e14 FLOP/s achieved over 8e15 available = 6%.
    assert mfu(6 * 8e9, 10_000, 8, 1e15) == pytest.approx(0.06)


def test_jsonl_writer_appends_one_object_per_line(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    writer = JsonlWriter(path)
    writer.write(StepMetrics(10, 2.5, 1.0, 1e-3, 100.0, 0.1, 0.2, 1.0, 3.0))
    writer.write({"event": "done"})
    writer.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["step"] == 10 and rows[0]["loss"] == 2.5 and rows[0]["mfu"] == 0.2
    assert rows[1] == {"event": "done"}
