"""The entry the three commands share: ``--version`` and ``--help`` without the heavy libraries, a short header
instead of the recipe, and a stopped run that ends with the command that resumes it (which then does)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from titanpod.graph import loop
from titanpod.pretrain.cli import main as pretrain_main
from titanpod.recipes.app import App, resume_command

HEAVY = ("torch", "jax", "transformers")
"""Libraries a command line must not need to be read."""

TINY_RUN = [
    "--train.steps", "3", "--train.log-every", "1", "--data.source", "synthetic",
    "--data.seq-len", "16", "--data.batch-size", "2", "--model.flavor", "debug",
]  # fmt: skip


def heavy_imports_of(app: str, flag: str) -> subprocess.CompletedProcess[str]:
    """``titanpod-<app> <flag>`` in a fresh interpreter; its last line of output lists the heavy libraries it
    imported."""
    script = (
        f"import sys\nfrom titanpod.{app}.cli import main\ntry:\n    code = main([{flag!r}])\n"
        f"except SystemExit as stop:\n    code = stop.code\n"
        f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\nsys.exit(code)"
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)


@pytest.mark.parametrize("app", ["pretrain", "posttrain", "diffusion"])
def test_version_answers_without_importing_torch_jax_or_transformers(app):
    done = heavy_imports_of(app, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"titanpod-{app} 0.1.0", "[]"]


@pytest.mark.parametrize("app", ["pretrain", "posttrain", "diffusion"])
def test_help_lists_every_recipe_field_without_importing_torch_jax_or_transformers(app):
    done = heavy_imports_of(app, "--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "[]"
    assert any(line.startswith(f"usage: titanpod-{app}") for line in lines)
    assert "--train.steps" in done.stdout and "--print-recipe" in done.stdout


def test_the_resume_command_names_the_runs_recipe_file_and_the_run():
    pretrain = App(prog="titanpod-pretrain", distribution="titanpod-pretrain", commands="unused")
    assert resume_command(pretrain, Path("runs", "try 1")) == (
        "titanpod-pretrain --recipe 'runs/try 1/recipe.json' --resume 'try 1'"
    )
    diffusion = App(prog="titanpod-diffusion", distribution="x", commands="x", resume_flag="--output.run-name")
    assert resume_command(diffusion, Path("runs", "f")) == (
        "titanpod-diffusion --recipe runs/f/recipe.json --output.run-name f"
    )


def sigterm_at(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the training loop send SIGTERM to this process as step ``step`` starts (its handler runs at once)."""
    schedule, sent = loop.lr_multiplier, []

    def lr_multiplier(step_number: int, config: Any) -> float:
        if step_number == step and not sent:  # once: the loop may ask for a step's rate more than once
            sent.append(step)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        return schedule(step_number, config)

    monkeypatch.setattr(loop, "lr_multiplier", lr_multiplier)


def test_a_stopped_run_prints_a_short_header_and_the_command_that_resumes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    schedule = loop.lr_multiplier
    sigterm_at(2, monkeypatch)
    assert pretrain_main([*TINY_RUN, "--output.run-name", "cut"]) == 128 + signal.SIGTERM
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("titanpod-pretrain: recipe llama3_debug (every setting: --print-recipe")
    assert not any(line.startswith(("{", "}", '  "')) for line in lines)  # no recipe JSON
    assert "layout one process" in out
    resume = next(line for line in lines if line.startswith("to resume, run: "))
    command = shlex.split(resume.removeprefix("to resume, run: "))
    assert command == ["titanpod-pretrain", "--recipe", "runs/cut/recipe.json", "--resume", "cut"]

    monkeypatch.setattr(loop, "lr_multiplier", schedule)  # no signal this time
    assert pretrain_main(command[1:]) == 0
    resumed = capsys.readouterr().out
    assert "resumed from" in resumed and "2 of 3 steps done" in resumed
    assert "to resume" not in resumed
