"""The progress bar, the summary and metrics.jsonl give one tokens/s and one MFU for a run."""

from __future__ import annotations

import io
import json
import re
import warnings

from rich.console import Console

from titanpod.graph import PeakTooLowWarning
from titanpod.pretrain.command import parse_recipe, print_summary
from titanpod.runs import run_pretraining

SHORT = [
    "--recipe", "llama3_debug", "--device.lane", "cpu", "--train.steps", "4", "--train.warmup-steps", "1",
    "--train.log-every", "2", "--data.seq-len", "32", "--data.batch-size", "2",
    "--output.no-tensorboard", "--checkpoint.at-end", "False", "--output.save-weights", "False",
]  # fmt: skip


def test_bar_summary_and_metrics_agree_on_tokens_per_second_and_mfu(tmp_path):
    recipe = parse_recipe([*SHORT, "--output.runs-dir", str(tmp_path), "--output.run-name", "run"])
    assert recipe is not None
    shown = io.StringIO()
    console = Console(file=shown, width=200, force_terminal=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PeakTooLowWarning)  # MFU above 100% would be a warning
        result = run_pretraining(recipe, console)
    print_summary(console, result)
    text = shown.getvalue()

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    reports = [row for row in rows if "tokens_per_second" in row]
    assert [row["step"] for row in reports] == [2, 4]
    last = reports[-1]
    summary = result.summary
    assert summary.tokens_per_second == last["tokens_per_second"]
    assert summary.mfu == last["mfu"] and 0 < summary.mfu <= 1

    bar = re.findall(r"4/4 loss [\d.]+ ([\d,]+) tok/s", text)
    assert bar, text
    assert bar[-1] == f"{last['tokens_per_second']:,.0f}"
    assert re.search(rf"tokens/s \(after step 1\)\s*│\s*{re.escape(bar[-1])}\s", text), text
    assert f"{summary.mfu:.1%}; peak: fp32 matmul measured on this machine" in re.sub(r"\s*│\s*", " ", text)
    assert "fp32 matmul measured on this machine" in reports[0]["mfu_peak"]
