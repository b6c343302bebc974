"""``titanpod-launch --max-restarts`` with a command that does not name its run is refused before torchrun starts
(exit 2, a usage error), so torchrun never counts the refusal as a failure to restart; a command that names its run,
by flag or in its recipe file, is launched."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest

from titanpod.runs.pod_launch.cli import main
from titanpod.runs.pod_launch.run_name import names_its_run


@pytest.fixture(autouse=True)
def restored_environment():
    """The launcher sets its variables (MASTER_ADDR, WORLD_SIZE, ...) in its own process's environment for the
    agent it starts; here that process is the test worker, whose later tests must not see them."""
    with mock.patch.dict(os.environ):
        yield


def test_max_restarts_without_a_run_name_is_refused_before_torchrun(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--lane", "cpu", "--hosts", "localhost", "--max-restarts", "1", "--dry-run", "--", "titanpod-pretrain"])
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert "name the run in the command (--output.run-name NAME" in captured.err
    assert "torchrun" not in captured.out  # nothing was launched, nor would be


@pytest.mark.parametrize(
    "command",
    [["titanpod-pretrain", "--output.run-name", "r"], ["titanpod-pretrain", "--output.run-name=r"],
     ["titanpod-pretrain", "--resume", "r"]],
)  # fmt: skip
def test_a_command_that_names_its_run_is_launched(command, capsys):
    assert main(["--lane", "cpu", "--hosts", "localhost", "--max-restarts", "1", "--dry-run", "--", *command]) == 0
    assert "would run: " in capsys.readouterr().out


def test_a_recipe_file_naming_the_run_counts(tmp_path):
    named, unnamed = tmp_path / "named.json", tmp_path / "unnamed.toml"
    named.write_text(json.dumps({"output": {"run_name": "r"}}))
    unnamed.write_text('base = "llama3_debug"\n')
    assert names_its_run(["titanpod-pretrain", "--recipe", str(named)])
    assert not names_its_run(["titanpod-pretrain", "--recipe", str(unnamed)])
    assert not names_its_run(["titanpod-pretrain", "--output.run-name"])  # a flag without its value
