"""loss.png: a run's training and validation loss and learning rate, read back from metrics.jsonl (a resumed run's
whole history), drawn by rank 0 at the end; a plot that cannot be drawn never fails the run."""

import dataclasses
import json
import math

import pytest
from PIL import Image

from titanpod.device import get_backend
from titanpod.graph import StepMetrics
from titanpod.recipes import llama3_debug
from titanpod.recipes.recipe import OutputConfig
from titanpod.runs import session_writers
from titanpod.runs.loss_plot import read_loss_history, write_loss_plot
from titanpod.runs.session import RunSession

BLUE, ORANGE, GREEN = (31, 119, 180), (255, 127, 14), (44, 160, 44)  # training loss, validation loss, lr


def write_lines(path, rows):
    path.write_text("".join(row if isinstance(row, str) else json.dumps(row) + "\n" for row in rows))


def test_a_resumed_runs_history_is_the_one_its_weights_followed(tmp_path):
    first_run = [
        {"step": 10, "loss": 4.0, "lr": 1e-3},
        {"step": 20, "loss": 3.0, "lr": 2e-3},
        {"step": 20, "validation_loss": 3.1},
        {"step": 20, "eval_accuracy": 0.5},
        {"step": 30, "loss": 2.5, "lr": 3e-3},
        {"step": 40, "loss": 2.4, "lr": 3e-3},
        {"step": 40, "validation_loss": 2.6},
    ]
    resumed_from_30 = [
        {"step": 40, "loss": 2.2, "lr": 3e-3},
        {"step": 40, "validation_loss": 2.3},
        {"step": 50, "loss": 2.0, "lr": 2e-3},
        '{"step": 60, "loss": 1.',  # killed while writing
    ]
    write_lines(tmp_path / "metrics.jsonl", first_run + resumed_from_30)
    history = read_loss_history(tmp_path / "metrics.jsonl")
    assert history.steps == [10, 20, 30, 40, 50]
    assert history.losses == [4.0, 3.0, 2.5, 2.2, 2.0]
    assert history.lrs == [1e-3, 2e-3, 3e-3, 3e-3, 2e-3]
    assert history.validation_steps == [20, 40] and history.validation_losses == [3.1, 2.3]


def colour_pixels(image, colour, rows):
    """How many pixels of ``rows`` (a range of y) are within a few levels of ``colour``."""
    width = image.size[0]
    return sum(
        1
        for y in rows
        for x in range(width)
        if all(abs(a - b) <= 8 for a, b in zip(image.getpixel((x, y)), colour, strict=True))
    )


def test_loss_png_plots_training_and_validation_loss_above_the_learning_rate(tmp_path):
    rows = []
    for step in range(10, 501, 10):
        rows.append({"step": step, "loss": 2 + 8 * math.exp(-step / 100), "lr": 3e-4 * min(1.0, step / 50)})
        if step % 100 == 0:
            rows.append({"step": step, "validation_loss": 2.2 + 8 * math.exp(-step / 100)})
    write_lines(tmp_path / "metrics.jsonl", rows)
    path = write_loss_plot(tmp_path, "llama3_debug")
    assert path == tmp_path / "loss.png"
    with Image.open(path) as plot:
        assert plot.format == "PNG" and plot.size == (800, 550)
        image = plot.convert("RGB")
    loss_panel, lr_panel = range(30, 360), range(390, 500)  # the upper three quarters, the lower quarter
    assert colour_pixels(image, BLUE, loss_panel) > 200 and colour_pixels(image, BLUE, lr_panel) == 0
    assert colour_pixels(image, ORANGE, loss_panel) > 50
    assert colour_pixels(image, GREEN, lr_panel) > 200 and colour_pixels(image, GREEN, loss_panel) == 0
    title = image.crop((300, 0, 500, 25)).convert("L")
    assert min(title.tobytes()) < 100  # the recipe's name, in dark text


def test_nothing_is_drawn_before_the_first_report(tmp_path):
    assert write_loss_plot(tmp_path, "llama3_debug") is None  # no metrics.jsonl
    write_lines(tmp_path / "metrics.jsonl", [{"step": 5, "validation_loss": 3.0}])
    assert write_loss_plot(tmp_path, "llama3_debug") is None
    assert not (tmp_path / "loss.png").exists()


def report(step: int, loss: float) -> StepMetrics:
    return StepMetrics(step, loss, 1.0, 1e-3, 100.0, 0.1, 0.01, None, float(step))


def test_the_session_draws_its_reports_and_a_failure_to_draw_is_only_a_warning(tmp_path, monkeypatch):
    recipe = dataclasses.replace(llama3_debug(), output=OutputConfig(runs_dir=str(tmp_path), run_name="run"))
    with RunSession(recipe, get_backend("cpu")) as session:
        for step, loss in ((1, 5.0), (2, 4.0), (3, 3.5)):
            session.write_report(report(step, loss))
        assert session.draw_loss_plot() == tmp_path / "run" / "loss.png"
        with Image.open(tmp_path / "run" / "loss.png") as plot:
            assert plot.format == "PNG"

        def broken(*args, **kwargs):
            raise OSError("No space left on device")

        monkeypatch.setattr(session_writers, "write_loss_plot", broken)
        with pytest.warns(RuntimeWarning, match=r"could not draw loss.png: OSError: No space left on device"):
            assert session.draw_loss_plot() is None
