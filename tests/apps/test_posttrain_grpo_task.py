"""titanpod-posttrain GRPO on a user's own task, as a user runs it (a real process): prompts and answers from a
JSON lines file, a reward function from a module beside it; and each mistake in them refused with the fix
before a run directory is written."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.apps.test_posttrain_cli import posttrain
from titanpod.checkpoint import save_model
from titanpod.data.sft.tokenizer import load_sft_tokenizer
from titanpod.models import DecoderArgs
from titanpod.posttrain.cli import main
from titanpod.recipes.families import build_model

TINY = DecoderArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_dim=64, max_seq_len=48)
REWARD = textwrap.dedent(
    """
    CALLS = []

    def digits_and_level(prompt, completion, row):
        with open("calls.jsonl", "a") as log:
            log.write(__import__("json").dumps({"prompt": prompt, "row": row}) + "\\n")
        return sum(char.isdigit() for char in completion) / 4 + row["level"]

    def text(prompt, completion, row):
        return "high"
    """
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory with a tiny model folder (as an SFT run leaves it), a task file and a reward module."""
    where = tmp_path_factory.mktemp("user_task")
    model = build_model("llama3", TINY)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    save_model(model, "llama3", where / "model", {"step": 0}, extra_files=load_sft_tokenizer("chars").files())
    rows = [{"q": f"{a}+{a}=", "a": str(2 * a), "level": a % 2} for a in range(40)]
    (where / "sums.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (where / "my_rewards.py").write_text(REWARD)
    return where


def grpo_args(*args: str) -> list[str]:
    return [
        "--recipe", "grpo_debug", "--model.init-from", "model", "--grpo.data-path", "sums.jsonl",
        "--grpo.prompt-column", "q", "--grpo.answer-column", "a", "--train.steps", "2", "--train.warmup-steps", "1",
        "--grpo.prompts-per-step", "2", "--grpo.group-size", "3", "--grpo.max-new-tokens", "4",
        "--eval.examples", "4", "--eval.max-new-tokens", "4", "--grpo.eval-samples", "0", "--device.lane", "cpu",
        "--checkpoint.export-hf", "False", *args,
    ]  # fmt: skip


@pytest.mark.slow
def test_a_users_task_file_and_reward_function_train_end_to_end(workdir):
    args = grpo_args("--grpo.reward-function", "my_rewards:digits_and_level", "--output.run-name", "mine")
    done = posttrain(*args, cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    run = workdir / "runs" / "mine"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["weights_version"] for row in steps if "reward_mean" in row] == [1, 2]
    calls = [json.loads(line) for line in (workdir / "calls.jsonl").read_text().splitlines()]
    rows = {row["q"]: row for row in map(json.loads, (workdir / "sums.jsonl").read_text().splitlines())}
    assert len(calls) >= 1 + 2 * 2 * 3  # the check before training, then every completion of both steps
    assert all(call["row"] == rows[call["prompt"]] for call in calls)  # each call got its prompt's whole row
    evaluation = json.loads((run / "eval.json").read_text())
    held_out = {completion["prompt"] for completion in evaluation["after"]["completions"]}
    trained = {call["prompt"] for call in calls[1:]}
    assert held_out and not held_out & trained and held_out <= set(rows)
    assert recipe_of(run)["grpo"]["reward_function"] == "my_rewards:digits_and_level"


def recipe_of(run: Path) -> dict:
    return json.loads((run / "recipe.json").read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--grpo.data-path", "nothere.jsonl"), "grpo.data_path 'nothere.jsonl': no such file"),
        (("--grpo.answer-column", "answer"), "no column 'answer' (its columns: q, a, level)"),
        (("--grpo.reward-function", "my_rewards.digits"), "is not an import path: write module:function"),
        (("--grpo.reward-function", "no_such_module:f"), "cannot import the module 'no_such_module'"),
        (("--grpo.reward-function", "my_rewards:text"), "returned str 'high', not a number"),
    ],
)
def test_each_mistake_is_refused_with_the_fix_before_any_work(workdir, args, message, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the reward's import may add the current directory
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    try:
        code = main(grpo_args(*args, "--output.run-name", "refused"))
    except SystemExit as stop:  # a recipe value the command line refuses while parsing
        code = stop.code
    assert code not in (0, None)
    said = capsys.readouterr()
    assert message in " ".join((said.out + said.err).replace("│", " ").split()), said.out + said.err
    assert not (workdir / "runs" / "refused").exists()
