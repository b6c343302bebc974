"""TensorBoard images from PNG files, the figures trackers get at a run's end, and W&B's missing-extra error."""

from __future__ import annotations

import sys

import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.graph.wandb_records import history, offline_environment, summary, wandb_records
from titanpod.graph import StepMetrics, TensorBoardWriter, TrainSummary
from titanpod.graph.metrics import flat_config
from titanpod.graph.tracking import WandbWriter, final_figures


def test_a_png_becomes_a_tensorboard_image_with_its_bytes_and_size(tmp_path):
    path = tmp_path / "grid.png"
    Image.new("RGB", (40, 24), (200, 10, 10)).save(path)
    writer = TensorBoardWriter(tmp_path / "tb")
    writer.write_image(3, "samples", path)
    writer.write_image(6, "samples", path)
    writer.close()
    board = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    board.Reload()
    images = board.Images("samples")
    assert [image.step for image in images] == [3, 6]
    assert (images[0].width, images[0].height) == (40, 24)
    assert images[0].encoded_image_string == path.read_bytes()


def test_flat_config_names_nested_fields_with_dots():
    flat = flat_config({"train": {"lr": 0.1, "steps": 4}, "model": {"init_from": None}, "allow": ("a", "b")})
    assert flat == {"train.lr": 0.1, "train.steps": 4, "model.init_from": "None", "allow": '["a", "b"]'}


def test_final_figures_take_the_last_report_and_the_whole_run():
    report = StepMetrics(4, 2.25, 1.0, 1e-3, 100.0, 0.1, 0.2, None, 3.0)
    summary = TrainSummary(4, [3.0, 2.5, 2.5, 2.0], 120.0, 0.25, None, 9.0, reports=[report], skipped_steps=[2])
    assert final_figures(summary) == {
        "steps_done": 4, "tokens_per_second": 120.0, "mfu": 0.25, "wall_seconds": 9.0, "skipped_steps": 1,
        "final_loss": 2.25,
    }  # fmt: skip
    without_reports = TrainSummary(2, [3.0, float("nan")], 0.0, 0.0, None, 1.0)  # a post-training run's
    assert final_figures(without_reports)["final_loss"] == 3.0  # the last finite loss


def test_wandb_missing_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails as when it is not installed
    with pytest.raises(ImportError, match=r"pip install 'titanpod-graph\[wandb\]'"):
        WandbWriter("project", "offline", tmp_path, "run", {})


def test_wandb_offline_keeps_images_and_the_summary(tmp_path, monkeypatch):
    for name, value in offline_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "grid.png"
    Image.new("RGB", (40, 24), (200, 10, 10)).save(path)
    writer = WandbWriter("project", "offline", tmp_path / "run", "run", {"train": {"lr": 0.1}})
    writer.write_scalars(3, {"validation_loss": 2.5})
    writer.write_image(3, "samples", path)
    writer.write_summary({"final_loss": 2.0})
    writer.close()
    records = wandb_records(next(writer.run_dir.glob("run-*.wandb")))
    logged = history(records)
    assert list(logged) == [3], [record.WhichOneof("record_type") for record in records]
    assert logged[3]["eval/validation_loss"] == 2.5
    assert logged[3]["samples._type"] == "image-file"
    assert (logged[3]["samples.width"], logged[3]["samples.height"]) == (40, 24)
    assert (writer.run_dir / "files" / logged[3]["samples.path"]).read_bytes() == path.read_bytes()
    assert summary(records)["final_loss"] == 2.0
