"""Run names are one folder name: a run name or a recipe name that would lead out of the runs folder (``../../x``),
or holds a newline, a terminal escape or another control character, or is longer than a folder name can be, is
refused while the command line is read, naming the field (and the recipe file), and nothing is written."""

from __future__ import annotations

import dataclasses

import pytest

from titanpod.pretrain.cli import main
from titanpod.recipes import OutputConfig, get_recipe


def written(folder) -> list[str]:
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*"))


def test_a_run_name_leading_out_of_the_runs_folder_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["--output.runs-dir", "a/runs", "--output.run-name", "../../x", "--train.steps", "1"])
    assert stopped.value.code == 2
    error = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert "output.run_name '../../x' must be one folder name" in error
    assert written(tmp_path) == []


def test_a_recipe_file_whose_name_leads_out_of_the_runs_folder_is_refused_naming_the_file(tmp_path, capsys):
    recipe_file = tmp_path / "mine.toml"
    recipe_file.write_text(f'base = "llama3_debug"\nname = "../../x"\n\n[output]\nruns_dir = "{tmp_path / "runs"}"\n')
    assert main(["--recipe", str(recipe_file), "--train.steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --recipe {recipe_file} is not a recipe titanpod can read: name '../../x' must be one folder name "
        "(not empty, at most 200 bytes, no '/', '\\', control characters such as newlines or terminal escapes, or "
        "leading '.'): it names the run directory inside output.runs_dir. Give the recipe another name (--name NAME, "
        "or name = ... in its file). (--help lists every field and its choices)"
    )
    assert written(tmp_path) == ["mine.toml"]


@pytest.mark.parametrize(
    "name",
    [".", "..", ".hidden", "a/b", "../x", "/abs", "a\\b", "a\0b", "a\nb", "a\rb", "a\x1b[2Jb", "\x1b]0;t\x07",
     "a\u202eb", "a\u2028b", "a\x7fb", "x" * 201, "\u00e9" * 101],
)  # fmt: skip
def test_a_run_name_must_be_one_folder_name(name):
    with pytest.raises(ValueError, match=r"^output\.run_name .* must be one folder name .* --output\.run-name NAME\.$"):
        OutputConfig(run_name=name)
    with pytest.raises(ValueError, match=r"^name .* must be one folder name"):
        dataclasses.replace(get_recipe("llama3_debug"), name=name)


def test_an_empty_recipe_name_is_refused_and_an_empty_run_name_means_the_default():
    with pytest.raises(ValueError, match=r"^name '' must be one folder name"):
        dataclasses.replace(get_recipe("llama3_debug"), name="")
    assert OutputConfig(run_name="").run_name == ""  # a recipe file's way to leave it unset: <recipe>-<time>


def test_a_run_name_with_a_terminal_escape_is_refused_and_printed_escaped(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["--output.run-name", "run\x1b[2J\nx", "--train.steps", "1"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "\x1b" not in error and "\\x1b[2J\\nx" in " ".join(error.replace("│", " ").split())
    assert written(tmp_path) == []


def test_a_long_name_of_200_bytes_is_a_folder_name():
    assert OutputConfig(run_name="x" * 200).run_name == "x" * 200
