"""A tiny pretraining run with ``--profile.steps`` and ``--output.wandb`` (offline): the trace, the TensorBoard
event file and the offline W&B run hold what the run did."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from tests.graph.wandb_records import config, history, offline_environment, summary, wandb_records
from titanpod.pretrain.command import parse_recipe
from titanpod.runs import run_pretraining

TINY = [
    "--recipe", "llama3_debug", "--device.lane", "cpu", "--train.steps", "4", "--train.warmup-steps", "1",
    "--train.log-every", "2", "--data.seq-len", "32", "--data.batch-size", "2",
    "--data.validation-fraction", "0.1", "--data.validation-batches", "1", "--data.validation-every", "2",
    "--output.save-weights", "False", "--checkpoint.at-end", "False",
]  # fmt: skip


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B kept off the network and out of the home folder."""
    for name, value in offline_environment(tmp_path).items():
        monkeypatch.setenv(name, value)


def test_profiled_tracked_run_writes_a_trace_tensorboard_and_an_offline_wandb_run(tmp_path, offline_wandb):
    where = ["--output.runs-dir", str(tmp_path), "--output.run-name", "run"]
    tracked = ["--profile.steps", "2-3", "--output.wandb", "titanpod-test", "--output.wandb-mode", "offline"]
    recipe = parse_recipe([*TINY, *where, *tracked])
    assert recipe is not None
    result = run_pretraining(recipe)
    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    reports = {row["step"]: row for row in rows if "loss" in row}
    validation = {row["step"]: row["validation_loss"] for row in rows if "validation_loss" in row}
    assert sorted(reports) == [2, 4] and sorted(validation) == [2, 4]

    # The trace: a Chrome trace of this process (rank 0) with a range for each traced step and no other.
    traces = list((run_dir / "profile").glob("rank0.*.pt.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    steps = sorted({event["name"] for event in events if event.get("name", "").startswith("step ")})
    assert steps == ["step 2", "step 3"]
    assert any(event.get("name", "").startswith("aten::") for event in events)  # the model's operators

    # TensorBoard: losses, validation losses, the recipe as text, the hyper-parameters with the final loss.
    board = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("train/loss")] == [
        (step, pytest.approx(reports[step]["loss"])) for step in (2, 4)
    ]
    assert [(e.step, e.value) for e in board.Scalars("eval/validation_loss")] == [
        (step, pytest.approx(validation[step])) for step in (2, 4)
    ]
    recipe_text = board.Tensors("recipe/text_summary")[0].tensor_proto.string_val[0].decode()
    ran = json.loads((run_dir / "recipe.json").read_text())  # the recipe as the run resolved it (its tokenizer)
    assert json.loads(recipe_text.removeprefix("```json\n").removesuffix("\n```")) == ran
    assert board.Scalars("hparams/final_loss")[0].value == pytest.approx(reports[4]["loss"])
    assert board.Scalars("hparams/validation_loss")[0].value == pytest.approx(validation[4])
    content = board.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    chosen = session.session_start_info.hparams
    assert chosen["train.steps"].number_value == 4 and chosen["data.seq_len"].number_value == 32
    assert chosen["model.family"].string_value == "llama3" and chosen["profile.steps"].string_value == "2-3"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert "hparams/final_loss" in {info.name.tag for info in experiment.metric_infos}

    # The offline W&B run: the recipe as config, every report and validation loss at its step, the summary.
    [offline] = list((run_dir / "wandb").glob("offline-run-*"))
    records = wandb_records(next(offline.glob("run-*.wandb")))
    logged = history(records)
    assert sorted(logged) == [2, 4]
    for step in (2, 4):
        assert logged[step]["train/loss"] == pytest.approx(reports[step]["loss"])
        assert logged[step]["train/mfu"] == pytest.approx(reports[step]["mfu"])
        assert logged[step]["eval/validation_loss"] == pytest.approx(validation[step])
    recipe_config = config(records)
    assert recipe_config["train"]["steps"] == 4 and recipe_config["profile"]["steps"] == "2-3"
    final = summary(records)
    assert final["final_loss"] == pytest.approx(reports[4]["loss"])
    assert final["steps_done"] == result.summary.steps_done == 4
