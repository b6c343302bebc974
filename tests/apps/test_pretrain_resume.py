"""``titanpod-pretrain --resume NAME`` continues a run as its own recipe.json says, and refuses, before it builds
anything and leaving every file of the run as it was, what it cannot continue: fewer steps than are done, a
changed model or attention (unless ``--checkpoint.allow-changes`` names it) and data rewritten in place."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from titanpod.pretrain.cli import main
from titanpod.runs import pretrain as pretrain_runner

TINY = [
    "--train.log-every", "1", "--data.source", "synthetic", "--data.seq-len", "16", "--data.batch-size", "2",
]  # fmt: skip
"""A recipe small enough to train a step in moments (the rest is llama3_debug's)."""


def folder_digest(folder: Path) -> str:
    """Every entry under ``folder``: its path, its kind, its modification time and (a file's) bytes, hashed."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}|{path.is_dir()}|{stat.st_mtime_ns}|".encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def pretrain(runs: Path, *args: str) -> int:
    """``titanpod-pretrain *args --output.runs-dir runs`` in this process; its exit status."""
    return main([*args, "--output.runs-dir", str(runs)])


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """The runs folder of a finished 2-step run named ``pt`` (trained once per module)."""
    runs = tmp_path_factory.mktemp("resume") / "runs"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "300")
        assert pretrain(runs, *TINY, "--train.steps", "2", "--output.run-name", "pt") == 0
    return runs


@pytest.fixture
def runs(tmp_path, two_steps, monkeypatch):
    """A copy of ``two_steps`` of this test's own, read at a wide console."""
    monkeypatch.setenv("COLUMNS", "300")
    shutil.copytree(two_steps, tmp_path / "runs", symlinks=True)
    return tmp_path / "runs"


def test_fewer_steps_than_the_run_has_done_are_refused_and_nothing_changes(runs, capsys):
    before = folder_digest(runs)
    assert pretrain(runs, "--resume", "pt", *TINY, "--train.steps", "1") != 0
    out, err = capsys.readouterr()
    said = " ".join((out + err).split())
    assert "has done 2 steps" in said and "--train.steps 1 is fewer" in said
    assert "--train.steps N" in said  # how to continue it
    assert "steps done" not in said  # nothing was resumed
    assert folder_digest(runs) == before


def test_a_finished_run_resumed_as_it_is_says_so_and_changes_nothing(runs, capsys):
    before = folder_digest(runs)
    assert pretrain(runs, "--resume", "pt") == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "Run pt is finished: 2 of 2 steps done" in said and "--train.steps N" in said
    assert folder_digest(runs) == before


def test_a_resume_continues_the_runs_own_recipe_and_shows_what_a_flag_changes(runs, capsys):
    assert pretrain(runs, "--resume", "pt", "--train.steps", "3") == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "train.steps: 2 -> 3" in said and "2 of 3 steps done" in said
    recipe = json.loads((runs / "pt" / "recipe.json").read_text())
    (kept,) = (runs / "pt" / "recipe-history").glob("recipe-*.json")
    earlier = json.loads(kept.read_text())
    assert recipe["train"]["steps"] == 3 and earlier["train"]["steps"] == 2
    recipe["train"]["steps"] = earlier["train"]["steps"]
    recipe["output"]["runs_dir"] = earlier["output"]["runs_dir"]  # this test's copy of the run is elsewhere
    assert recipe == earlier  # the saved recipe was the base: nothing but the flag given changed


def test_a_resume_does_not_stop_again_where_an_earlier_part_of_the_run_stopped(runs, capsys):
    assert pretrain(runs, "--resume", "pt", "--train.steps", "4", "--train.stop-at-step", "3") == 0
    assert pretrain(runs, "--resume", "pt") == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "train.stop_at_step: 3 -> 0" in said and "3 of 4 steps done" in said
    rows = [json.loads(line) for line in (runs / "pt" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]


def test_a_changed_attention_window_is_refused_before_anything_is_built(runs, capsys, monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("the model was built before the change was refused")

    monkeypatch.setattr(pretrain_runner, "build_seeded_model", built)
    before = folder_digest(runs)
    assert pretrain(runs, "--resume", "pt", *TINY, "--train.steps", "3", "--kernels.window", "4") != 0
    said = " ".join(capsys.readouterr().err.split())
    assert "kernels.window: None -> 4" in said and "--checkpoint.allow-changes kernels.window" in said
    assert folder_digest(runs) == before


def test_a_larger_model_is_refused_before_it_is_built_naming_each_field(runs, capsys, monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("the model was built before the change was refused")

    monkeypatch.setattr(pretrain_runner, "build_seeded_model", built)
    monkeypatch.setattr(pretrain_runner, "check_recipe_fits_device", built)
    before = folder_digest(runs)
    flags = ["--model.flavor", "1B", "--model.shape.n-layers", "3", "--train.steps", "3"]
    assert pretrain(runs, "--resume", "pt", *flags) != 0
    said = " ".join(capsys.readouterr().err.split())
    assert "model.flavor: 'debug' -> '1B'" in said and "model.shape.n_layers: None -> 3" in said
    assert "--checkpoint.allow-changes model.flavor,model.shape.n_layers" in said
    assert folder_digest(runs) == before


def test_a_change_allowed_by_name_resumes_and_is_said(runs, capsys):
    allowed = ["--kernels.window", "4", "--checkpoint.allow-changes", "kernels.window"]
    assert pretrain(runs, "--resume", "pt", *TINY, "--train.steps", "3", *allowed) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "kernels.window: None -> 4" in said and "2 of 3 steps done" in said
    assert json.loads((runs / "pt" / "recipe.json").read_text())["kernels"]["window"] == 4
    assert pretrain(runs, "--resume", "pt", "--train.steps", "4", "--kernels.window", "8") != 0  # allowed once only
    assert "kernels.window: 4 -> 8" in " ".join(capsys.readouterr().err.split())


def test_data_rewritten_in_place_is_refused_naming_the_file_unless_allowed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "300")
    corpus, runs = tmp_path / "corpus.txt", tmp_path / "runs"
    corpus.write_text("\n".join(f"line {number} of a small corpus to train on" for number in range(200)))
    data = ["--data.source", "text", "--data.path", str(corpus), *TINY[4:]]
    assert pretrain(runs, *TINY[:2], *data, "--train.steps", "2", "--output.run-name", "tf") == 0
    corpus.write_text(corpus.read_text().replace("small", "other"))  # the same size, other words
    capsys.readouterr()
    before = folder_digest(runs)
    resume = ["--resume", "tf", *TINY[:2], *data, "--train.steps", "3"]  # the run's own flags, and one more step
    assert pretrain(runs, *resume) != 0
    said = " ".join(capsys.readouterr().err.split())
    assert f"{corpus} changed (its first" in said and "--checkpoint.allow-changes data.path" in said
    assert folder_digest(runs) == before
    assert pretrain(runs, *resume, "--checkpoint.allow-changes", "data.path") == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"on changed data files (allowed by --checkpoint.allow-changes data.path): {corpus} changed" in said
    assert "2 of 3 steps done" in said
