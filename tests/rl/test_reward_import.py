"""A user's reward named by import path: found from the current directory or a file, called with the prompt,
the completion and the row; a bad path, a missing module or function and a non-number are each refused with
the fix before any training work. While scoring, each call has a time limit, and a call past it, a sys.exit,
NaN, infinity or an absurd number stops scoring naming the sample; other exceptions only skip the sample."""

import math
import sys
import textwrap
import threading

import pytest

from titanpod.data.tasks import Example
from titanpod.recipes.posttrain.grpo_recipe import GRPOConfig
from titanpod.rl.grpo.reward_call import RewardStop, RewardTimeout, call_with_timeout
from titanpod.rl.grpo.reward_import import REWARD_LIMIT, check_reward, import_reward
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


COMPLETIONS = [Completion(0, [1, 2], [3], [-0.5], "length", 0), Completion(0, [1, 2], [4], [-0.5], "length", 1)]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e308, -1e308, REWARD_LIMIT * 1.5])
def test_a_reward_a_run_cannot_train_on_stops_scoring_naming_the_sample(value):
    def second_is_bad(prompt, completion, answer):
        return value if completion == "second one" else 1.0

    with pytest.raises(RewardStop) as stop:
        score_completions([EXAMPLE], COMPLETIONS, ["first", "second one"], second_is_bad)
    message = str(stop.value)
    assert f"second_is_bad returned {value} on prompt 0, completion 1 of the step" in message
    assert "(prompt 'What is 2 plus 3?', completion 'second one')" in message
    assert f"no larger than {REWARD_LIMIT:g} in size" in message and "scale large scores down" in message


@pytest.mark.parametrize("value", [REWARD_LIMIT, -REWARD_LIMIT, 0.0])
def test_rewards_up_to_the_limit_are_scored(value):
    rewards, errors = score_completions([EXAMPLE], COMPLETIONS, ["a", "b"], lambda p, c, a: value)
    assert rewards == [value, value] and errors == []


def test_a_long_prompt_and_completion_are_cut_in_the_message():
    long = Example("x" * 100, "5")
    with pytest.raises(RewardStop, match=r"\(prompt 'x{40}…', completion 'y{40}…'\)"):
        score_completions([long], COMPLETIONS[:1], ["y" * 100], lambda p, c, a: math.nan)


def test_a_call_past_its_limit_is_left_running_in_a_daemon_thread_and_given_up_on():
    release = threading.Event()
    try:
        with pytest.raises(RewardTimeout, match=r"no answer within 0.2 s"):
            call_with_timeout(release.wait, 0.2, "judge")
        [left] = [thread for thread in threading.enumerate() if thread.name == "reward judge"]
        assert left.daemon and left.is_alive()  # it cannot keep the process from ending
    finally:
        release.set()
    assert call_with_timeout(lambda: 2.5, 0.2, "quick") == 2.5


def test_a_hanging_reward_stops_scoring_with_the_limit_and_the_flag():
    release = threading.Event()
    try:
        with pytest.raises(RewardStop) as stop:
            score_completions([EXAMPLE], COMPLETIONS, ["a", "b"], lambda p, c, a: release.wait(), timeout_s=0.2)
    finally:
        release.set()
    assert "did not return within 0.2 s on prompt 0, completion 0 of the step" in str(stop.value)
    assert "--grpo.reward-timeout-s (now 0.2)" in str(stop.value)


def test_sys_exit_in_a_reward_stops_scoring_and_other_exceptions_skip_the_sample():
    def exits(prompt, completion, answer):
        sys.exit(3)

    with pytest.raises(RewardStop, match=r"exits called sys.exit\(3\) on prompt 0, completion 0 of the step"):
        score_completions([EXAMPLE], COMPLETIONS, ["a", "b"], exits)

    def interrupted(prompt, completion, answer):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the run's signal handling decides, as without a thread
        score_completions([EXAMPLE], COMPLETIONS, ["a", "b"], interrupted)

    rewards, errors = score_completions([EXAMPLE], COMPLETIONS, ["a", "b"], lambda p, c, a: 1 / 0)
    assert rewards == [None, None] and all("ZeroDivisionError" in error for error in errors)


def test_the_check_before_training_refuses_a_reward_that_exits_hangs_or_is_absurd(tmp_path):
    (tmp_path / "bad.py").write_text(
        "import sys, threading\n"
        "def exits(prompt, completion, row):\n    sys.exit(0)\n"
        "def hangs(prompt, completion, row):\n    threading.Event().wait()\n"
        "def huge(prompt, completion, row):\n    return -1e308\n"
    )
    refusals = {
        "exits": r"called sys.exit\(0\) on the first training prompt .* Return a number",
        "hangs": r"did not return within 0.2 s on the first training prompt .*--grpo.reward-timeout-s \(now 0.2\)",
        "huge": r"returned -1e\+308 on the first training prompt .*no larger than 1e\+06 in size",
    }
    for name, message in refusals.items():
        with pytest.raises(ValueError, match=message):
            check_reward(import_reward(f"{tmp_path / 'bad.py'}:{name}"), EXAMPLE, timeout_s=0.2)


@pytest.mark.parametrize("timeout", [0.0, -1.0, math.inf, math.nan])
def test_a_reward_timeout_that_is_not_a_positive_number_of_seconds_is_refused(timeout):
    with pytest.raises(ValueError, match=r"reward_timeout_s must be a number of seconds above 0"):
        GRPOConfig(reward_timeout_s=timeout)
