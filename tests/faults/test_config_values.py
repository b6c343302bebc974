"""Values a run cannot train with are refused before any work: the command exits 2 with one message naming the
field (and the recipe file it came from), and writes no run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from titanpod.pretrain.cli import main

QUICK = ["--train.steps", "2", "--data.seq-len", "32", "--data.batch-size", "2"]


def refused(argv: list[str], cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``titanpod-pretrain argv`` printed on stderr, after checking it exited 2 and wrote no run."""
    monkeypatch.chdir(cwd)
    try:
        code = main(argv)
    except SystemExit as exit_:  # a flag's value refused while parsing
        code = exit_.code
    assert code == 2
    assert not (cwd / "runs").exists()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return " ".join(err.replace("│", " ").split())  # the message as one line, whatever box it is drawn in


def recipe_file(folder: Path, train_section: str) -> Path:
    path = folder / "mine.toml"
    path.write_text(f'base = "llama3_debug"\n\n[train]\n{train_section}\n', encoding="utf-8")
    return path


def test_a_nan_learning_rate_is_refused(tmp_path, capsys, monkeypatch):
    message = refused([*QUICK, "--train.lr", "nan"], tmp_path, capsys, monkeypatch)
    assert "train.lr must be a finite number, got nan" in message


def test_an_infinite_learning_rate_is_refused(tmp_path, capsys, monkeypatch):
    message = refused([*QUICK, "--train.lr", "inf"], tmp_path, capsys, monkeypatch)
    assert "train.lr must be a finite number, got inf" in message


def test_steps_past_the_float_range_in_a_recipe_file_are_refused(tmp_path, capsys, monkeypatch):
    path = recipe_file(tmp_path, "steps = 1e999")
    message = refused(["--recipe", str(path)], tmp_path, capsys, monkeypatch)
    assert f"--recipe {path}" in message
    assert "train.steps must be a whole number, got inf" in message


def test_steps_written_as_text_in_a_recipe_file_name_the_field_and_the_file(tmp_path, capsys, monkeypatch):
    path = recipe_file(tmp_path, 'steps = "100"')
    message = refused(["--recipe", str(path)], tmp_path, capsys, monkeypatch)
    assert f"--recipe {path}" in message
    assert "train.steps must be a whole number, got '100' (text): write the number without quotes" in message


def test_a_beta_of_one_or_more_is_refused(tmp_path, capsys, monkeypatch):
    message = refused([*QUICK, "--train.beta2", "1.0"], tmp_path, capsys, monkeypatch)
    assert "train.beta2 must be at least 0 and below 1, got 1.0" in message


def test_a_negative_beta_in_a_recipe_file_is_refused(tmp_path, capsys, monkeypatch):
    path = recipe_file(tmp_path, "beta1 = -0.1")
    message = refused(["--recipe", str(path)], tmp_path, capsys, monkeypatch)
    assert f"--recipe {path}" in message and "train.beta1 must be at least 0 and below 1, got -0.1" in message


def test_a_boolean_given_for_a_whole_number_is_refused(tmp_path, capsys, monkeypatch):
    path = recipe_file(tmp_path, "log_every = true")
    message = refused(["--recipe", str(path)], tmp_path, capsys, monkeypatch)
    assert "train.log_every must be a whole number, got True (bool)" in message
