"""titanpod-posttrain SFT under torchrun: fsdp 2 on two gloo processes trains like one process.

Each data rank's loss is the mean over its own labelled (response) tokens, and the reported loss
and the gradients are the mean over the data ranks. One process computes the same objective over
the same global batch as two accumulated micro-batches: the rows rank 0 and rank 1 read, in order.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli_runs import run_cli
from titanpod.checkpoint import load_model

STEPS = 5
RUN = [
    "--recipe", "sft_debug", "--device.lane", "cpu", "--train.steps", str(STEPS), "--train.warmup-steps", "1",
    "--train.log-every", "1", "--data.train-examples", "64", "--data.seq-len", "32", "--data.batch-size", "2",
    "--eval.examples", "4", "--eval.max-new-tokens", "3", "--eval.show", "0", "--checkpoint.no-export-hf",
    "--output.no-tensorboard",
]  # fmt: skip


def posttrain(cwd, *args: str, processes: int = 1) -> subprocess.CompletedProcess[str]:
    return run_cli("titanpod.posttrain.cli", [*RUN, *args], cwd, processes)


@pytest.mark.slow
def test_sft_fsdp2_on_two_processes_equals_one_process_over_the_same_global_batch(tmp_path):
    sharded = posttrain(tmp_path, "--parallel.fsdp", "2", "--output.run-name", "two", processes=2)
    assert sharded.returncode == 0, sharded.stdout[-2000:] + sharded.stderr[-4000:]
    assert sharded.stdout.count("titanpod-posttrain summary") == 1  # rank 0 alone reports
    single = posttrain(tmp_path, "--train.grad-accum-steps", "2", "--output.run-name", "one")
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-4000:]
    runs = tmp_path / "runs"
    assert sorted(path.name for path in runs.iterdir()) == ["one", "two"]

    def losses(name: str) -> list[float]:
        rows = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()]
        return [row["loss"] for row in rows if "loss" in row]

    two, one = losses("two"), losses("one")
    assert len(two) == len(one) == STEPS
    for step, (got, want) in enumerate(zip(two, one, strict=True), 1):
        assert abs(got - want) <= 1e-5 * abs(want), f"step {step}: {got} vs {want}"
    assert one[-1] < one[0]  # it learns
    _, two_model = load_model(runs / "two" / "model")
    _, one_model = load_model(runs / "one" / "model")
    # Weights: each tensor within 1e-5 of its norm. Entry by entry, Adam divides by the gradient's own
    # scale, so an entry whose gradient is near zero turns reduction-order rounding into a visible
    # difference (1.1e-5 in one tok_embeddings row, seen here); none may differ by more than its
    # updates could move it (lr 3e-3 per step).
    for (name, a), b in zip(two_model.state_dict().items(), one_model.state_dict().values(), strict=True):
        assert (a - b).norm().item() <= 1e-5 * b.norm().item(), name
        assert (a - b).abs().max().item() <= STEPS * 3e-3, name
    # Held-out accuracy ran on both ranks in the sharded forward; rank 0 wrote it once, as one process does.
    two_eval, one_eval = (json.loads((runs / name / "eval.json").read_text()) for name in ("two", "one"))
    for label in ("before", "after"):
        assert two_eval[label]["step"] == one_eval[label]["step"]
        assert two_eval[label]["completions"] == one_eval[label]["completions"], label
