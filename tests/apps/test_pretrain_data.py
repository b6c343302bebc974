"""titanpod-pretrain on local data files through the datasets library: every debug recipe trains end to end
with validation loss reported, and a streamed run resumed from its checkpoint ends where an uninterrupted one does."""

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file

from tests.apps.test_pretrain_cli import pretrain
from titanpod.data import builtin_corpus_path

SHORT = [
    "--train.steps", "4", "--train.warmup-steps", "1", "--train.log-every", "2",
    "--data.seq-len", "32", "--data.batch-size", "2",
]  # fmt: skip


def documents() -> list[str]:
    return [text for text in builtin_corpus_path().read_text(encoding="utf-8").split("\n\n") if text.strip()][:400]


def write_data(folder: Path, kind: str) -> Path:
    texts = documents()
    if kind == "parquet":
        path = folder / "docs.parquet"
        pq.write_table(pa.table({"body": texts}), path)
    elif kind == "json":  # one JSON array of records
        path = folder / "docs.json"
        path.write_text(json.dumps([{"text": text} for text in texts]), encoding="utf-8")
    else:
        path = folder / "docs.jsonl"
        path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("recipe", "kind", "extra"),
    [
        ("llama3_debug", "jsonl", []),
        ("qwen3_debug", "parquet", ["--data.text-field", "body", "--data.document-masking"]),
        ("qwen3_moe_debug", "json", []),
    ],
)
def test_debug_recipes_train_on_local_files_and_report_validation_loss(tmp_path, recipe, kind, extra):
    path = write_data(tmp_path, kind)
    result = pretrain(
        "--recipe", recipe, *SHORT, "--data.source", kind, "--data.path", str(path), *extra,
        "--data.validation-fraction", "0.1", "--data.validation-every", "2", "--data.validation-batches", "2",
        "--output.run-name", "run", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"data: {kind} {path}" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    validation = {row["step"]: row["validation_loss"] for row in rows if "validation_loss" in row}
    assert sorted(validation) == [2, 4]
    assert all(math.isfinite(loss) and 0 < loss < 20 for loss in validation.values())
    assert "step 4: validation loss" in result.stdout


def test_a_streamed_run_resumed_from_its_checkpoint_ends_with_the_same_weights(tmp_path):
    path = write_data(tmp_path, "jsonl")
    data = ["--data.source", "jsonl", "--data.path", str(path), "--data.streaming"]
    straight = pretrain(*SHORT, *data, "--output.run-name", "straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    first = pretrain(
        *SHORT, *data, "--output.run-name", "split", "--checkpoint.every", "2", "--train.stop-at-step", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    second = pretrain(*SHORT, *data, "--output.run-name", "split", "--resume", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed from" in second.stdout
    expected = load_file(tmp_path / "runs" / "straight" / "model" / "model.safetensors")
    resumed = load_file(tmp_path / "runs" / "split" / "model" / "model.safetensors")
    assert expected.keys() == resumed.keys()
    for name, tensor in expected.items():
        assert resumed[name].equal(tensor), name
