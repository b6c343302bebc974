"""The tokens a model card and model.json report: every sequence a step trained on, accumulated micro-batches too."""

from __future__ import annotations

import json

from tests.cli_runs import run_cli


def test_model_json_counts_the_tokens_of_every_accumulated_micro_batch(tmp_path):
    run = ["--train.steps", "2", "--train.warmup-steps", "1", "--data.seq-len", "32", "--data.batch-size", "2",
           "--train.grad-accum-steps", "3", "--output.no-tensorboard", "--output.run-name", "counted"]  # fmt: skip
    done = run_cli("titanpod.pretrain.cli", run, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    about = json.loads((tmp_path / "runs" / "counted" / "model" / "model.json").read_text())["about"]
    assert about["tokens"] == 2 * 2 * 3 * 32  # steps x sequences x micro-batches x tokens a sequence
