"""titanpod-posttrain end to end, as a user runs it (a real process): a short sft_debug writes the run, and a
second run initialised from the first's model folder starts from exactly those weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from titanpod.checkpoint import load_model
from titanpod.posttrain.cli import main
from titanpod.posttrain.command import parse_command

SHORT_SFT = [
    "--train.steps", "4", "--train.warmup-steps", "1", "--train.log-every", "2",
    "--data.train-examples", "200", "--data.seq-len", "64", "--data.batch-size", "4",
    "--eval.examples", "6", "--eval.max-new-tokens", "4", "--device.lane", "cpu",
]  # fmt: skip


def posttrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "titanpod.posttrain.cli", *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_a_short_sft_debug_writes_the_run_and_a_second_run_starts_from_its_model(tmp_path):
    first = posttrain("--recipe", "sft_debug", *SHORT_SFT, "--output.run-name", "first", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    run = tmp_path / "runs" / "first"
    assert "titanpod-posttrain summary" in first.stdout and "held-out accuracy after (step 4)" in first.stdout
    assert json.loads((run / "recipe.json").read_text())["name"] == "sft_debug"
    for name in ("tokenizer.json", "tokenizer_config.json", "eval.json", "metrics.jsonl"):
        assert (run / name).is_file(), name
    for name in ("model.safetensors", "model.json", "recipe.json", "tokenizer.json"):
        assert (run / "model" / name).is_file(), name
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (run / "hf" / name).is_file(), name
    assert (run / "checkpoints" / "step-000004" / "trainer.json").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == [2, 4]
    assert [row["step"] for row in rows if "eval_accuracy" in row] == [0, 4]
    first_eval = json.loads((run / "eval.json").read_text())
    assert first_eval["task"] == "reverse" and len(first_eval["after"]["completions"]) == 6

    second = posttrain(
        "--recipe", "sft_debug", *SHORT_SFT, "--train.steps", "2", "--output.run-name", "second",
        "--model.init-from", str(run / "model"), cwd=tmp_path,
    )  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"parameters from {run / 'model'} (llama3)" in second.stdout
    second_eval = json.loads((tmp_path / "runs" / "second" / "eval.json").read_text())
    assert second_eval["before"]["step"] == 0  # a new run, from the first run's weights: the same completions
    assert second_eval["before"]["completions"] == first_eval["after"]["completions"]

    grpo = posttrain(
        "--recipe", "grpo_debug", "--grpo.task", "reverse", "--model.init-from", str(run / "model"),
        "--train.steps", "2", "--train.warmup-steps", "1", "--grpo.prompts-per-step", "2", "--grpo.group-size", "3",
        "--grpo.max-new-tokens", "4", "--eval.examples", "4", "--eval.max-new-tokens", "4",
        "--device.lane", "cpu", "--output.run-name", "grpo", cwd=tmp_path,
    )  # fmt: skip
    assert grpo.returncode == 0, grpo.stdout + grpo.stderr
    grpo_run = tmp_path / "runs" / "grpo"
    steps = [json.loads(line) for line in (grpo_run / "metrics.jsonl").read_text().splitlines()]
    assert [row["weights_version"] for row in steps if "reward_mean" in row] == [1, 2]
    grpo_eval = json.loads((grpo_run / "eval.json").read_text())
    assert grpo_eval["before"]["completions"] == first_eval["after"]["completions"][:4]  # started from the SFT model
    assert "sampled_accuracy" in grpo_eval["after"] and (grpo_run / "model" / "model.safetensors").is_file()
    assert "engine weights" in grpo.stdout and "version 2" in grpo.stdout

    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, ours = load_model(run / "model")
    theirs = AutoModelForCausalLM.from_pretrained(run / "hf")
    tokens = AutoTokenizer.from_pretrained(run / "hf")("reverse: abc\n", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.allclose(ours(tokens), theirs(tokens).logits, atol=1e-4)


def test_list_recipes_overrides_and_a_wrong_name(capsys):
    assert main(["--list-recipes"]) == 0
    assert "sft_debug" in capsys.readouterr().out
    command = parse_command(["--recipe", "sft_debug", "--train.lr", "0.01", "--data.task", "add"])
    assert command is not None and command.kind == "sft"
    assert command.recipe.train.lr == 0.01 and command.recipe.data.task == "add" and command.recipe.eval_task == "add"
    assert main(["--recipe", "sft_debgu"]) == 2
    assert "Did you mean 'sft_debug'" in capsys.readouterr().err


def test_resume_without_a_run_to_continue_says_so(tmp_path, capsys):
    assert main(["--resume", "--output.runs-dir", str(tmp_path)]) == 2
    assert "no run of recipe sft_debug" in capsys.readouterr().err


def test_an_unknown_task_or_missing_init_folder_fails_before_training_with_the_fix(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:  # tyro reports a field refused while parsing, and exits
        main(["--data.task", "revers", "--output.runs-dir", str(tmp_path)])
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())  # tyro's message, out of its box
    assert "invalid choice 'revers' for argument '--data.task'. Expected one of ('reverse', 'add', 'arith')" in err
    assert main(["--model.init-from", str(tmp_path / "nowhere"), "--output.runs-dir", str(tmp_path)]) == 1
    assert "neither a local folder nor a Hub id" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
