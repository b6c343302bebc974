"""A user's reward named by import path: found from the current directory or a file, called with the prompt,
the completion and the row; a bad path, a missing module or function and a non-number are each refused with
the fix before any training work."""

import sys
import textwrap

import pytest

from titanpod.data.tasks import Example
from titanpod.rl.grpo.reward_import import check_reward, import_reward
from titanpod.rl.grpo.rewards import score_completions
from titanpod.rl.rollout import Completion

REWARDS = textwrap.dedent(
    """
    def level_bonus(prompt, completion, row):
        return float(completion.strip() == row["target"]) + row["level"] / 10

    def words(prompt, completion, row):
        return "many"

    def two_arguments(prompt, completion):
        return 1.0

    threshold = 3
    """
)
EXAMPLE = Example("What is 2 plus 3?", "5", {"question": "What is 2 plus 3?", "target": "5", "level": 2})


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of rewards in the directory the command runs from, importable by name only from there."""
    name = f"user_rewards_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield name
    sys.modules.pop(name, None)


def test_a_module_in_the_current_directory_is_found_and_called_with_the_row(user_module):
    reward = import_reward(f"{user_module}:level_bonus")
    assert reward.score(EXAMPLE, " 5 ") == pytest.approx(1.2)
    assert reward.score(EXAMPLE, "6") == pytest.approx(0.2)


def test_a_file_path_names_the_module_too(tmp_path):
    (tmp_path / "mine.py").write_text(REWARDS)
    reward = import_reward(f"{tmp_path / 'mine.py'}:level_bonus")
    assert reward.score(EXAMPLE, "5") == pytest.approx(1.2)


def test_a_built_in_tasks_example_gives_its_prompt_and_answer_as_the_row(user_module):
    seen = []
    reward = import_reward(f"{user_module}:level_bonus")
    reward = type(reward)(lambda prompt, completion, row: seen.append(row) or 1.0, "seen")
    reward.score(Example("reverse: abc\n", "cba"), "cba")
    assert seen == [{"prompt": "reverse: abc\n", "answer": "cba"}]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", r"not an import path: write it as module:function"),
        ("module_that_is_not_there_x:f", r"cannot import the module 'module_that_is_not_there_x'"),
        ("{module}:missing", r"has no 'missing' \(its functions: level_bonus, two_arguments, words\)"),
        ("{module}:threshold", r"'threshold' is not a function \(it is int\)"),
        ("{module}:two_arguments", r"cannot be called as two_arguments\(prompt, completion, row\)"),
        ("nowhere/rewards.py:f", r"no such file 'nowhere/rewards.py'"),
    ],
)
def test_a_bad_import_path_is_refused_with_the_fix(user_module, spec, message):
    with pytest.raises(ValueError, match=message):
        import_reward(spec.format(module=user_module))


def test_a_reward_returning_a_non_number_is_refused_before_training(user_module):
    reward = import_reward(f"{user_module}:words")
    with pytest.raises(ValueError, match=r"failed on the first training prompt .*returned str 'many', not a number"):
        check_reward(reward, EXAMPLE)
    check_reward(import_reward(f"{user_module}:level_bonus"), EXAMPLE)  # a number: accepted


def test_a_non_number_during_training_skips_the_sample_and_says_why():
    completion = Completion(0, [1, 2], [3], [-0.5], "length", 0)
    rewards, errors = score_completions([EXAMPLE], [completion], ["5"], lambda p, c, a: "1.0")
    assert rewards == [None] and "returned str '1.0', not a number" in errors[0]
